"""Policy losses (DIS, PPO, GSPO, TIS/MIS), value loss, KL estimators, entropy."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algo_reference import dis_loop, gspo_loop, ppo_loop, tis_loop
from sao.algo import (aggregate, dis_policy_loss, entropy_from_logits, gspo_loss, kl_penalty,
                      ppo_clip_fraction, ppo_clip_loss, tis_policy_loss, value_loss)

B, T = 4, 16


def make_inputs(seed, spread=1.0):
    rng = np.random.default_rng(seed)
    rollout = -rng.random((B, T)).astype(np.float32) * 3
    logprobs = rollout + spread * rng.normal(size=(B, T)).astype(np.float32)
    adv = rng.normal(size=(B, T)).astype(np.float32)
    mask = rng.random((B, T)) < 0.7
    return logprobs, rollout, adv, mask


def loss_grad(fn, logprobs, *args, **kw):
    """Per-token loss and d(sum loss)/d logprobs."""
    return jax.value_and_grad(lambda lp: jnp.sum(fn(lp, *args, **kw)[0]))(jnp.asarray(logprobs))


def test_dis_matches_loop_values_and_gradients():
    logprobs, rollout, adv, mask = make_inputs(0)
    loss, diag = dis_policy_loss(logprobs, rollout, adv, mask, eps_low=0.3, eps_high=1.0)
    ref_loss, ref_grad = dis_loop(logprobs, rollout, adv, mask, 0.3, 1.0)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    _, grad = loss_grad(dis_policy_loss, logprobs, rollout, adv, mask, eps_low=0.3, eps_high=1.0)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)
    ratio = np.exp(logprobs - rollout)[mask]
    np.testing.assert_allclose(diag["frac_masked_low"], np.mean(ratio <= 0.7), atol=1e-6)
    np.testing.assert_allclose(diag["frac_masked_high"], np.mean(ratio >= 2.0), atol=1e-6)
    np.testing.assert_allclose(diag["mean_ratio"], ratio.mean(), rtol=1e-5)
    np.testing.assert_allclose(diag["max_abs_log_ratio"],
                               np.abs(logprobs - rollout)[mask].max(), rtol=1e-6)
    assert 0 < diag["frac_masked_low"] < 1 and 0 < diag["frac_masked_high"] < 1


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_dis_gradient_zero_outside_band_for_both_signs(sign):
    log_ratio = np.log(np.array([[0.5, 0.69, 0.71, 1.0, 5.9, 6.1, 40.0]], np.float32))
    rollout = np.full_like(log_ratio, -2.0)
    adv = np.full_like(log_ratio, sign)
    mask = np.ones_like(log_ratio, bool)
    _, grad = loss_grad(dis_policy_loss, rollout + log_ratio, rollout, adv, mask,
                        eps_low=0.3, eps_high=5.0)
    inside = np.array([[0, 0, 1, 1, 1, 0, 0]], bool)
    np.testing.assert_array_equal(np.asarray(grad)[~inside], 0.0)
    np.testing.assert_allclose(np.asarray(grad)[inside], -sign * np.exp(log_ratio[inside]),
                               rtol=1e-5)


def test_dis_masked_positions_never_leak_nan():
    logprobs, rollout, adv, mask = make_inputs(1)
    logprobs[~mask], rollout[~mask], adv[~mask] = -np.inf, np.nan, np.inf
    loss, grad = loss_grad(dis_policy_loss, logprobs, rollout, adv, mask, eps_low=0.3,
                           eps_high=5.0)
    assert np.isfinite(loss) and np.all(np.isfinite(grad))


def test_bf16_inputs_computed_in_f32():
    logprobs, rollout, adv, mask = make_inputs(2, spread=0.1)
    bf = [jnp.asarray(x, jnp.bfloat16) for x in (logprobs, rollout, adv)]
    loss, _ = dis_policy_loss(*bf, mask, eps_low=0.3, eps_high=5.0)
    assert loss.dtype == jnp.float32
    up = [np.asarray(x, np.float32) for x in bf]
    ref, _ = dis_loop(*up, mask, 0.3, 5.0)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("clip_c", [None, 3.0])
def test_ppo_clip_matches_loop(clip_c):
    logprobs, old, adv, mask = make_inputs(3, spread=0.6)
    loss, diag = ppo_clip_loss(logprobs, old, adv, mask, eps_low=0.2, eps_high=0.28,
                               clip_ratio_c=clip_c)
    np.testing.assert_allclose(loss, ppo_loop(logprobs, old, adv, mask, 0.2, 0.28, clip_c),
                               rtol=1e-5, atol=1e-6)
    if clip_c is not None:
        assert 0 < diag["dual_clip_fraction"] < 1


def test_ppo_clip_fraction_respects_advantage_sign():
    ratio = np.array([[2.0, 2.0, 0.5, 0.5, 1.0]], np.float32)
    adv = np.array([[1.0, -1.0, 1.0, -1.0, 1.0]], np.float32)
    # Clipped (no gradient): r>1.28 with A>0, and r<0.8 with A<0 -> 2 of 5.
    frac = ppo_clip_fraction(ratio, adv, np.ones_like(adv, bool), eps_low=0.2, eps_high=0.28)
    np.testing.assert_allclose(frac, 0.4)
    _, grad = loss_grad(ppo_clip_loss, np.log(ratio), np.zeros_like(ratio), adv,
                        np.ones_like(adv, bool))
    np.testing.assert_array_equal(np.asarray(grad) == 0, [[1, 0, 0, 1, 0]])


def test_gspo_sequence_ratio_and_gradient():
    logprobs, old, _, mask = make_inputs(4, spread=0.01)
    seq_adv = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    adv = np.repeat(seq_adv[:, None], T, axis=1)
    fn = functools.partial(gspo_loss, eps_low=0.3, eps_high=0.4)
    loss, diag = fn(logprobs, old, adv, mask)
    n = mask.sum(1)
    s = np.exp(np.where(mask, logprobs - old, 0).sum(1) / n)
    np.testing.assert_allclose(diag["mean_seq_ratio"], s.mean(), rtol=1e-5)
    np.testing.assert_allclose(loss, np.where(mask, -seq_adv[:, None] * s[:, None], 0), rtol=1e-5)
    # Rows 0 and 1 move outside the band in the direction their advantage pushes.
    shift = np.array([0.6, -0.6, 0.0, 0.05], np.float32)[:, None]
    wide_lp = old + shift + 0.1 * np.random.default_rng(9).normal(size=old.shape).astype(np.float32)
    wide, diag = jax.jit(fn)(wide_lp, old, adv, mask)
    np.testing.assert_allclose(diag["clip_fraction"], 0.5)
    np.testing.assert_allclose(wide, gspo_loop(wide_lp, old, adv, mask, 0.3, 0.4), rtol=1e-5,
                               atol=1e-6)
    grad = jax.grad(lambda lp: aggregate(fn(lp, old, adv, mask)[0], mask,
                                         "seq-mean-token-mean"))(jnp.asarray(logprobs))
    expect = np.where(mask, -seq_adv[:, None] * s[:, None] / n[:, None] / B, 0)
    np.testing.assert_allclose(grad, expect, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_tis_and_mis_weights(mode):
    logprobs = np.log(np.array([[0.5, 0.5, 0.5]], np.float32))
    old = logprobs.copy()  # ratio 1: PPO loss = -A
    rollout = old - np.log(np.array([[0.5, 1.5, 4.0]], np.float32))  # w = 0.5, 1.5, 4
    adv = np.ones_like(old)
    loss, diag = tis_policy_loss(logprobs, old, adv, np.ones_like(old, bool),
                                 rollout_logprobs=rollout, cap=2.0, mode=mode)
    expect = [[-0.5, -1.5, -2.0 if mode == "truncate" else 0.0]]
    np.testing.assert_allclose(loss, expect, rtol=1e-6)
    np.testing.assert_allclose(diag["frac_is_capped"], 1 / 3, rtol=1e-6)
    rng_lp, old_lp, adv_r, mask_r = make_inputs(7, spread=0.3)
    roll_lp = old_lp + 0.8 * np.random.default_rng(8).normal(size=old_lp.shape).astype(np.float32)
    loss, _ = jax.jit(functools.partial(tis_policy_loss, cap=1.5, mode=mode))(
        rng_lp, old_lp, adv_r, mask_r, rollout_logprobs=roll_lp)
    np.testing.assert_allclose(
        loss, tis_loop(rng_lp, old_lp, roll_lp, adv_r, mask_r, 0.2, 0.28, 1.5, mode),
        rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="mode"):
        tis_policy_loss(logprobs, old, adv, np.ones_like(old, bool), rollout_logprobs=rollout,
                        mode="clip")


def test_bad_policy_loss_inputs():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="shape"):
        dis_policy_loss(x, x[:, :2], x, x, eps_low=0.3, eps_high=5.0)
    with pytest.raises(ValueError, match="eps_low"):
        dis_policy_loss(x, x, x, x, eps_low=0.0, eps_high=5.0)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_clip_loss(x, x, x, x, clip_ratio_c=0.5)
    # NumPy scalars and arrays are checked like Python numbers; eps_low > 1
    # would put the band's lower edge 1 - eps_low below 0.
    for bad in (-0.2, np.float32(-0.2), np.asarray(1.5), np.inf):
        with pytest.raises(ValueError, match="eps_low"):
            dis_policy_loss(x, x, x, x, eps_low=bad, eps_high=5.0)
        with pytest.raises(ValueError, match="eps_low"):
            ppo_clip_loss(x, x, x, x, eps_low=bad)
    with pytest.raises(ValueError, match="eps_high"):
        gspo_loss(x, x, x, x, eps_high=np.float32(-1e-4))
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="cap"):
            tis_policy_loss(x, x, x, x, rollout_logprobs=x, cap=bad)
    dis_policy_loss(x, x, x, x, eps_low=1.0, eps_high=5.0)  # lower edge 0: allowed


def test_value_loss_plain_and_clipped():
    values = np.array([[1.0, 3.0, 0.0, 7.0]], np.float32)
    returns = np.array([[0.0, 2.0, 9.0, 1.0]], np.float32)
    old = np.array([[1.5, 2.0, 0.0, 0.0]], np.float32)
    mask = np.array([[1, 1, 0, 1]], bool)
    loss, _ = value_loss(values, returns, mask)
    np.testing.assert_allclose(loss, [[0.5, 0.5, 0.0, 18.0]])
    loss, diag = value_loss(values, returns, mask, old_values=old, clip_range=0.2)
    # V_clip = [1.3, 2.2, -, 0.2] -> max(0.5, 0.845), max(0.5, 0.02), max(18, 0.32).
    np.testing.assert_allclose(loss, [[0.845, 0.5, 0.0, 18.0]], rtol=1e-6)
    np.testing.assert_allclose(diag["value_clip_fraction"], 1 / 3, rtol=1e-6)
    grad = jax.grad(lambda v: jnp.sum(value_loss(v, returns, mask)[0]))(jnp.asarray(values))
    np.testing.assert_allclose(grad, np.where(mask, values - returns, 0.0))
    with pytest.raises(ValueError, match="old_values"):
        value_loss(values, returns, mask, clip_range=0.2)


def test_kl_estimators():
    rng = np.random.default_rng(5)
    lp, ref = rng.normal(size=(2, 5)).astype(np.float32), rng.normal(size=(2, 5)).astype(np.float32)
    mask = rng.random((2, 5)) < 0.6
    d = lp - ref
    expect = {"k1": d, "k2": 0.5 * d ** 2, "k3": np.exp(-d) - 1 + d, "k3_st": np.exp(-d) - 1 + d}
    for kind, value in expect.items():
        out = kl_penalty(lp, ref, mask, kind=kind)
        np.testing.assert_allclose(out, np.where(mask, value, 0), rtol=1e-5, atol=1e-6)
    grad = jax.grad(lambda x: jnp.sum(kl_penalty(x, ref, mask, kind="k3_st")))(jnp.asarray(lp))
    np.testing.assert_allclose(grad, mask.astype(np.float32))  # d k1 / d logprob = 1
    grad3 = jax.grad(lambda x: jnp.sum(kl_penalty(x, ref, kind="k3")))(jnp.asarray(lp))
    np.testing.assert_allclose(grad3, 1 - np.exp(-d), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="k4"):
        kl_penalty(lp, ref, kind="k4")


def test_entropy_from_logits_chunked_and_masked():
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(2, 8, 11)).astype(np.float32) * 3
    logits[0, 0, :5] = -np.inf  # masked vocabulary entries
    mask = rng.random((2, 8)) < 0.5
    z = logits / 0.7
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), -1)
    from_bf16 = entropy_from_logits(jnp.asarray(logits, jnp.bfloat16), temperature=0.7)
    np.testing.assert_allclose(entropy_from_logits(logits, temperature=0.7), ref, rtol=1e-5)
    chunked = entropy_from_logits(logits, mask, temperature=0.7, chunk_size=4)
    np.testing.assert_allclose(chunked, np.where(mask, ref, 0), rtol=1e-5)
    assert from_bf16.dtype == jnp.float32 and np.all(np.isfinite(from_bf16))
    grad = jax.grad(lambda x: jnp.sum(entropy_from_logits(x)))(jnp.asarray(logits))
    assert np.all(np.isfinite(grad))
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(logits, chunk_size=3)
