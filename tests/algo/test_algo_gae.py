"""Skip-observation GAE, reward relocation and length-adaptive lambda."""
import functools

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algo_reference import classic_gae_loop, gae_loop
from sao.algo import gae, length_adaptive_lambda, relocate_rewards, skip_gae

METHODS = ("chunked", "associative", "scan")
FAST_METHODS = ("chunked", "associative")  # checked against "scan", the literal recursion


@functools.lru_cache(maxsize=None)
def jitted_gae(method):
    return jax.jit(functools.partial(gae, method=method))


def random_batch(rng, batch, length, p_action=0.4):
    rewards = rng.normal(size=(batch, length)).astype(np.float32)
    values = rng.normal(size=(batch, length)).astype(np.float32)
    mask = rng.random((batch, length)) < p_action
    return rewards, values, mask


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_numpy_loop_on_random_masks(method, seed):
    rng = np.random.default_rng(seed)
    rewards, values, mask = random_batch(rng, 6, 97)
    mask[0] = False  # a row with no action token
    mask[1] = True  # a row with no observation token
    lam = rng.uniform(0.5, 0.99, size=6).astype(np.float32)
    bootstrap = rng.normal(size=6).astype(np.float32)
    for lam_arg in (0.9, lam):
        for boot in (None, bootstrap):
            adv, ret = gae(rewards, values, mask, gamma=0.97, lam=lam_arg,
                           bootstrap_value=boot, method=method)
            ref_adv, ref_ret = gae_loop(rewards, values, mask, 0.97, lam_arg, boot)
            np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_literal_recursion_matches_numpy_loop():
    # skip_gae._literal_gae (method="scan") against the NumPy loop, called directly.
    rng = np.random.default_rng(7)
    rewards, values, mask = random_batch(rng, 5, 41)
    mask[0] = False
    rewards[1, :3], mask[1, :3] = 2.0, False  # rewards before the first action: dropped
    values = np.where(mask, values, np.nan).astype(np.float32)  # never read off the mask
    lam = rng.uniform(0.0, 1.0, size=5).astype(np.float32)
    gamma = np.full(5, 0.95, np.float32)
    bootstrap = rng.normal(size=5).astype(np.float32)
    adv, ret = skip_gae._literal_gae(jnp.asarray(rewards), jnp.asarray(values),
                                     jnp.asarray(mask), gamma, lam, bootstrap)
    ref_adv, ref_ret = gae_loop(rewards, values, mask, 0.95, lam, bootstrap)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", FAST_METHODS)
@pytest.mark.parametrize("length", [1, 8, 37, 64, 203])  # block multiples and not
def test_fast_solvers_match_literal_recursion(method, length):
    rng = np.random.default_rng(length)
    rewards, values, mask = random_batch(rng, 7, length, p_action=0.5)
    mask[0] = False  # no action token
    mask[1] = True  # no observation token
    rewards = np.where(rng.random(rewards.shape) < 0.5, rewards, 0.0).astype(np.float32)
    values = np.where(mask, values, np.nan).astype(np.float32)  # never read off the mask
    lam = rng.uniform(0.0, 1.0, size=7).astype(np.float32)
    bootstrap = rng.normal(size=7).astype(np.float32)
    for gamma, lam_arg, boot in ((1.0, 1.0, None), (0.97, lam, bootstrap), (0.5, 0.0, None)):
        literal = gae(rewards, values, mask, gamma=gamma, lam=lam_arg, bootstrap_value=boot,
                      method="scan")
        fast = gae(rewards, values, mask, gamma=gamma, lam=lam_arg, bootstrap_value=boot,
                   method=method)
        np.testing.assert_allclose(fast[0], literal[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(fast[1], literal[1], rtol=1e-5, atol=1e-5)


# Hand-computed: mask [0,1,0,0,1], V(1)=0.5, V(4)=0.25, reward 1 on t=4,
# gamma=0.9, lam=0.8. t=4: delta=1-0.25=0.75=A4. t=1: delta=0.9*0.25-0.5=-0.275,
# A1=-0.275+0.72*0.75=0.265. Returns: R4=1.0, R1=0.765.
HAND_MASK = np.array([[0, 1, 0, 0, 1]], bool)
HAND_VALUES = np.array([[9.0, 0.5, 7.0, 7.0, 0.25]], np.float32)


@pytest.mark.parametrize("method", METHODS)
def test_hand_computed_terminal(method):
    rewards = np.array([[0, 0, 0, 0, 1.0]], np.float32)
    adv, ret = gae(rewards, HAND_VALUES, HAND_MASK, gamma=0.9, lam=0.8, method=method)
    np.testing.assert_allclose(adv, [[0, 0.265, 0, 0, 0.75]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0, 0.765, 0, 0, 1.0]], atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_hand_computed_truncated_with_bootstrap(method):
    # V(after last token)=2: A4 = 1 + 0.9*2 - 0.25 = 2.55; A1 = -0.275 + 0.72*2.55 = 1.561.
    rewards = np.array([[0, 0, 0, 0, 1.0]], np.float32)
    adv, ret = gae(rewards, HAND_VALUES, HAND_MASK, gamma=0.9, lam=0.8,
                   bootstrap_value=np.array([2.0], np.float32), method=method)
    np.testing.assert_allclose(adv, [[0, 1.561, 0, 0, 2.55]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0, 2.061, 0, 0, 2.8]], atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_reward_after_last_action_token_moves_back(method):
    mask = np.array([[0, 1, 0, 0, 1, 0, 0]], bool)
    values = np.array([[9.0, 0.5, 7.0, 7.0, 0.25, 3.0, np.nan]], np.float32)
    rewards = np.array([[0, 0, 0, 0, 0, 0, 1.0]], np.float32)
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8, method=method)
    np.testing.assert_allclose(adv, [[0, 0.265, 0, 0, 0.75, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0, 0.765, 0, 0, 1.0, 0, 0]], atol=1e-6)


def test_relocate_rewards_and_count_of_unassignable():
    mask = np.array([[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0]], bool)
    rewards = np.array([[5.0, 1.0, 0.0, 2.0, 0.0, 3.0], [0, 1.0, 0, 2.0, 0, 0]], np.float32)
    moved, dropped = relocate_rewards(rewards, mask)
    np.testing.assert_allclose(moved, [[0, 1, 2, 0, 3, 0], [0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(dropped, [1, 2])


@pytest.mark.parametrize("method", METHODS)
def test_row_without_action_tokens_is_zero_and_finite(method):
    rewards = np.array([[0.0, 1.0, 0.0]], np.float32)
    values = np.array([[np.nan, np.inf, 1.0]], np.float32)
    adv, ret = gae(rewards, values, np.zeros((1, 3), bool), gamma=1.0, lam=1.0,
                   bootstrap_value=np.array([3.0], np.float32), method=method)
    np.testing.assert_array_equal(adv, 0.0)
    np.testing.assert_array_equal(ret, 0.0)


@pytest.mark.parametrize("method", METHODS)
def test_tool_spans_of_different_lengths_give_same_advantages(method):
    # Same three action spans; the observation between them is 1 vs 40 tokens.
    rng = np.random.default_rng(3)
    act_values = rng.normal(size=9).astype(np.float32)
    spans = [3, 4, 2]

    def build(obs_lengths):
        mask, vals = [False] * 2, [0.0] * 2
        k = 0
        for span, obs in zip(spans, obs_lengths):
            mask += [True] * span + [False] * obs
            vals += list(act_values[k:k + span]) + list(rng.normal(size=obs))
            k += span
        rewards = np.zeros(len(mask), np.float32)
        rewards[np.flatnonzero(mask)[-1]] = 1.0
        return rewards[None], np.asarray(vals, np.float32)[None], np.asarray(mask)[None]

    short = build([1, 1, 0])
    long = build([40, 17, 5])
    adv_s, ret_s = gae(*short, gamma=0.95, lam=0.9, method=method)
    adv_l, ret_l = gae(*long, gamma=0.95, lam=0.9, method=method)
    np.testing.assert_allclose(adv_s[short[2]], adv_l[long[2]], atol=1e-6)
    np.testing.assert_allclose(ret_s[short[2]], ret_l[long[2]], atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_lambda_one_gives_monte_carlo_returns(method):
    rng = np.random.default_rng(4)
    rewards, values, mask = random_batch(rng, 3, 30)
    _, ret = gae(rewards, values, mask, gamma=0.9, lam=1.0, method=method)
    ref_mc, _ = gae_loop(rewards, np.zeros_like(values), mask, 0.9, 1.0)  # discounted returns
    np.testing.assert_allclose(ret, ref_mc, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_bf16_inputs_are_computed_in_f32(method):
    rng = np.random.default_rng(5)
    rewards, values, mask = random_batch(rng, 4, 50)
    r16, v16 = jnp.asarray(rewards, jnp.bfloat16), jnp.asarray(values, jnp.bfloat16)
    adv, ret = gae(r16, v16, mask, gamma=0.99, lam=0.95, method=method)
    assert adv.dtype == jnp.float32 and ret.dtype == jnp.float32
    r32, v32 = np.asarray(r16, np.float32), np.asarray(v16, np.float32)
    ref_adv, _ = gae_loop(r32, v32, mask, 0.99, 0.95)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)


def test_bad_inputs_raise():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="method"):
        gae(x, x, x, gamma=1.0, lam=1.0, method="fast")
    with pytest.raises(ValueError, match="shape"):
        gae(x, x[:, :2], x, gamma=1.0, lam=1.0)
    with pytest.raises(ValueError, match="bootstrap_value"):
        gae(x, x, x, gamma=1.0, lam=1.0, bootstrap_value=np.zeros(3))
    with pytest.raises(ValueError, match="lam"):
        gae(x, x, x, gamma=1.0, lam=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="gamma"):
        gae(x, x, x, gamma=1.5, lam=1.0)


def test_length_adaptive_lambda():
    mask = np.zeros((4, 10), bool)
    mask[1, :1] = True  # alpha*l = 1.5 -> 1 - 1/1.5
    mask[2, :4] = True  # 1 - 1/6
    mask[3, :] = True  # 1 - 1/15
    lam = length_adaptive_lambda(mask, alpha=1.5)
    np.testing.assert_allclose(lam, [0.0, 1 - 1 / 1.5, 1 - 1 / 6, 1 - 1 / 15], rtol=1e-6)
    assert np.all(np.isfinite(lam))
    np.testing.assert_array_equal(length_adaptive_lambda(mask[:2], alpha=0.5), [0.0, 0.0])
    with pytest.raises(ValueError, match="alpha"):
        length_adaptive_lambda(mask, alpha=0.0)


def test_no_recompile_for_new_values():
    calls = jax.jit(chex.assert_max_traces(
        lambda r, v, m, lam: gae(r, v, m, gamma=0.99, lam=lam), n=1))
    rng = np.random.default_rng(6)
    for _ in range(3):
        rewards, values, mask = random_batch(rng, 2, 16)
        calls(rewards, values, mask, rng.uniform(size=2).astype(np.float32))


# --- Hypothesis properties (fixed shapes so each jit compiles once) ---------

B, T, T_PAD = 3, 12, 30


@settings(max_examples=25, deadline=None, derandomize=True)  # reproducible in CI
@given(data=st.data(), method=st.sampled_from(METHODS),
       gamma=st.floats(0.5, 1.0), lam=st.floats(0.0, 1.0))
def test_all_ones_mask_reduces_to_classic_gae(data, method, gamma, lam):
    floats = st.floats(-10, 10, width=32)
    rewards = data.draw(hnp.arrays(np.float32, (B, T), elements=floats))
    values = data.draw(hnp.arrays(np.float32, (B, T), elements=floats))
    adv, _ = jitted_gae(method)(rewards, values, np.ones((B, T), bool), gamma=gamma, lam=lam)
    ref = np.stack([classic_gae_loop(rewards[b], values[b], gamma, lam) for b in range(B)])
    np.testing.assert_allclose(adv, ref, rtol=1e-5, atol=1e-4)


@settings(max_examples=25, deadline=None, derandomize=True)  # reproducible in CI
@given(data=st.data(), method=st.sampled_from(FAST_METHODS),
       gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0))
def test_fast_solvers_agree_with_literal_recursion(data, method, gamma, lam):
    floats = st.floats(-10, 10, width=32)
    mask = data.draw(hnp.arrays(bool, (B, T)))
    rewards = data.draw(hnp.arrays(np.float32, (B, T), elements=floats))
    values = data.draw(hnp.arrays(np.float32, (B, T), elements=floats))
    bootstrap = data.draw(hnp.arrays(np.float32, (B,), elements=floats))
    literal = jitted_gae("scan")(rewards, values, mask, gamma=gamma, lam=lam,
                                 bootstrap_value=bootstrap)
    fast = jitted_gae(method)(rewards, values, mask, gamma=gamma, lam=lam,
                              bootstrap_value=bootstrap)
    # |A| can reach ~300 (T=12 rewards of 10 plus values), hence atol.
    np.testing.assert_allclose(fast[0], literal[0], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(fast[1], literal[1], rtol=1e-5, atol=1e-4)


@settings(max_examples=25, deadline=None, derandomize=True)  # reproducible in CI
@given(data=st.data(), method=st.sampled_from(METHODS))
def test_inserting_observation_tokens_leaves_action_advantages(data, method):
    floats = st.floats(-10, 10, width=32)
    mask = data.draw(hnp.arrays(bool, (B, T)))
    rewards = data.draw(hnp.arrays(np.float32, (B, T), elements=floats))
    values = data.draw(hnp.arrays(np.float32, (B, T), elements=floats))
    base_adv, base_ret = jitted_gae(method)(rewards, values, mask, gamma=0.97, lam=0.9)
    # Insert observation tokens (zero reward, arbitrary value) anywhere, pad to T_PAD.
    big = [np.zeros((B, T_PAD), np.float32), np.full((B, T_PAD), np.nan, np.float32),
           np.zeros((B, T_PAD), bool)]
    for b in range(B):
        inserts = data.draw(st.lists(st.integers(0, T), max_size=T_PAD - T))
        positions = np.arange(T) + np.searchsorted(np.sort(inserts), np.arange(T), side="right")
        big[0][b, positions] = rewards[b]
        big[1][b, positions] = values[b]
        big[2][b, positions] = mask[b]
    adv, ret = jitted_gae(method)(*big, gamma=0.97, lam=0.9)
    # f32 rounding differs with block alignment; |A| can reach ~300, hence atol.
    np.testing.assert_allclose(adv[big[2]], base_adv[mask], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ret[big[2]], base_ret[mask], rtol=1e-5, atol=1e-4)


def test_gae_empty_batch_and_lam_range_checked():
    import numpy as _np
    from sao.algo import gae as _gae, relocate_rewards as _relocate
    for shape in ((0, 5), (3, 0)):
        z = _np.zeros(shape, _np.float32)
        for method in ("chunked", "associative", "scan"):
            adv, ret = _gae(z, z, z.astype(bool), gamma=1.0, lam=0.9, method=method)
            assert adv.shape == shape and ret.shape == shape
        relocated, unassigned = _relocate(z, z.astype(bool))
        assert relocated.shape == shape and unassigned.shape == (shape[0],)
    x = _np.zeros((2, 4), _np.float32)
    with pytest.raises(ValueError, match="lam"):
        _gae(x, x, x.astype(bool), gamma=1.0, lam=_np.array([0.5, 2.0], _np.float32))
    with pytest.raises(ValueError, match="gamma"):
        _gae(x, x, x.astype(bool), gamma=_np.float32(-1.0), lam=0.5)
    # Booleans, strings, complex and overflowing numbers name the argument too.
    for bad in (True, "0.5", 0.5 + 1j, 10**400):
        with pytest.raises(ValueError, match="lam"):
            _gae(x, x, x.astype(bool), gamma=1.0, lam=bad)
