"""Solvers of x_t = a_t x_{t+1} + b_t (sao/algo/recurrence.py) and the CPU fusion barrier."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.algo import gae, recurrence, relocate_rewards, skip_gae


def next_values_loop(a, b, x_end):
    """NumPy reference: x_{t+1} for every t, by a reverse loop in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    out = np.zeros_like(a)
    for row in range(a.shape[0]):
        x = float(x_end[row, 0])
        for t in range(a.shape[1] - 1, -1, -1):
            out[row, t] = x
            x = a[row, t] * x + b[row, t]
    return out


def random_coefficients(rng, batch, length):
    # Mix exact 0s and 1s (observation tokens, lam=0) with values in (0, 1).
    a = rng.choice([0.0, 1.0, 0.3, 0.9405], size=(batch, length)).astype(np.float32)
    a = np.where(rng.random((batch, length)) < 0.3, rng.uniform(size=(batch, length)), a)
    b = rng.normal(size=(batch, length)).astype(np.float32)
    x_end = rng.normal(size=(batch, 1)).astype(np.float32)
    return a.astype(np.float32), b, x_end


@functools.partial(jax.jit, static_argnames=("block", "group"))
def blocked_next(a, b, x_end, block, group):
    length = a.shape[1]
    a3 = recurrence.to_blocks(a, 1.0, block)
    b3 = recurrence.to_blocks(b, 0.0, block)
    x3 = recurrence.solve_blocked(lambda j: (a3[:, :, j], b3[:, :, j]), x_end, block, group)
    return recurrence.from_blocks(x3, length)


@pytest.mark.parametrize("length", [1, 7, 64, 80, 97, 300])  # 80: 10 blocks, not whole groups
@pytest.mark.parametrize("block,group", [(8, 8), (4, 2), (16, 4), (1, 1), (8, 3)])
def test_blocked_matches_loop(length, block, group):
    rng = np.random.default_rng(length * 31 + block)
    a, b, x_end = random_coefficients(rng, 5, length)
    got = blocked_next(a, b, x_end, block, group)
    np.testing.assert_allclose(got, next_values_loop(a, b, x_end), rtol=1e-5, atol=1e-5)


def test_associative_solver_matches_loop():
    rng = np.random.default_rng(3)
    a, b, x_end = random_coefficients(rng, 4, 53)
    got = jax.jit(recurrence.solve_associative)(a, b, x_end)
    np.testing.assert_allclose(got, next_values_loop(a, b, x_end), rtol=1e-5, atol=1e-5)


def test_hand_computed_blocked():
    # a = [0.5, 1, 2], b = [1, 2, 3], x_end = 10: x3 = 10, x2 = 2*10+3 = 23,
    # x1 = 1*23+2 = 25, so x_next = [25, 23, 10].
    a = np.array([[0.5, 1.0, 2.0]], np.float32)
    b = np.array([[1.0, 2.0, 3.0]], np.float32)
    got = blocked_next(a, b, np.array([[10.0]], np.float32), 2, 2)
    np.testing.assert_allclose(got, [[25.0, 23.0, 10.0]])


def test_to_blocks_pads_with_fill_and_from_blocks_drops_it():
    x = jnp.arange(10.0).reshape(1, 10)
    blocks = recurrence.to_blocks(x, -1.0, block=4)  # pad 10 -> 12 = 3 blocks of 4
    assert blocks.shape == (1, 3, 4)
    np.testing.assert_array_equal(blocks.reshape(-1)[10:], -1.0)
    assert recurrence.to_blocks(jnp.zeros((2, 16)), 0.0, block=8).shape == (2, 2, 8)
    np.testing.assert_array_equal(recurrence.from_blocks(blocks, 10), x)


def relocate_loop(rewards, mask):
    moved = np.zeros_like(rewards, dtype=np.float64)
    dropped = np.zeros(rewards.shape[0], np.int32)
    for row in range(rewards.shape[0]):
        last = None
        for t in range(rewards.shape[1]):
            if mask[row, t]:
                last = t
            if last is None:
                dropped[row] += rewards[row, t] != 0
            else:
                moved[row, last] += rewards[row, t]
    return moved, dropped


@settings(max_examples=20, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), p_action=st.sampled_from([0.0, 0.1, 0.5, 1.0]))
def test_relocate_matches_loop(seed, p_action):
    rng = np.random.default_rng(seed)
    rewards = np.where(rng.random((3, 37)) < 0.4, rng.normal(size=(3, 37)), 0.0)
    mask = rng.random((3, 37)) < p_action
    moved, dropped = relocate_rewards(rewards.astype(np.float32), mask)
    ref_moved, ref_dropped = relocate_loop(rewards, mask)
    np.testing.assert_allclose(moved, ref_moved, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(dropped, ref_dropped)


def blocked_operands(seed, batch=4, length=70):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(batch, length)).astype(np.float32)
    v = rng.normal(size=(batch, length)).astype(np.float32)
    m = rng.random((batch, length)) < 0.5
    gamma = jnp.full((batch, 1), 0.97)
    gl = gamma * jnp.asarray(rng.uniform(0.5, 1.0, size=(batch, 1)), jnp.float32)
    x_end = jnp.asarray(rng.normal(size=(batch, 1)), jnp.float32)
    return (recurrence.to_blocks(r, 0.0), recurrence.to_blocks(v, 0.0),
            recurrence.to_blocks(m, False), gamma, gl, x_end)


def test_fusion_barrier_is_the_same_function():
    operands = blocked_operands(0)
    plain = jax.jit(skip_gae._blocked_advantages)(*operands)
    behind_barrier = jax.jit(skip_gae._advantages_materialised)(*operands)
    np.testing.assert_array_equal(plain, behind_barrier)
    # A NaN first reward flips the predicate: the other (identical) branch runs.
    r3 = operands[0].at[0, 0, 0].set(jnp.nan)
    plain = jax.jit(skip_gae._blocked_advantages)(r3, *operands[1:])
    behind_barrier = jax.jit(skip_gae._advantages_materialised)(r3, *operands[1:])
    np.testing.assert_array_equal(plain, behind_barrier)


def test_cpu_lowering_keeps_the_conditional():
    # The barrier is only useful if XLA keeps it: the compiled CPU program must
    # still contain the conditional (a predicate XLA could fold would remove it).
    rng = np.random.default_rng(1)
    args = (rng.normal(size=(2, 64)).astype(np.float32),) * 2 + (rng.random((2, 64)) < 0.5,)
    text = jax.jit(functools.partial(gae, gamma=0.99, lam=0.95)).lower(*args).compile().as_text()
    assert "conditional(" in text


def test_gae_under_vmap_matches_unbatched():
    rng = np.random.default_rng(2)
    r = rng.normal(size=(3, 2, 40)).astype(np.float32)
    v = rng.normal(size=(3, 2, 40)).astype(np.float32)
    m = rng.random((3, 2, 40)) < 0.5
    batched = jax.vmap(lambda r, v, m: gae(r, v, m, gamma=0.9, lam=0.8))(r, v, m)
    for i in range(3):
        single = gae(r[i], v[i], m[i], gamma=0.9, lam=0.8)
        np.testing.assert_allclose(batched[0][i], single[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(batched[1][i], single[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method", ["chunked", "associative", "scan"])
def test_reverse_mode_gradients_through_gae_and_relocation(method):
    # The blocked solver's loop has static bounds (a scan), so jax.grad works
    # and agrees with the literal recursion (method="scan").
    rng = np.random.default_rng(4)
    r = rng.normal(size=(3, 37)).astype(np.float32)
    v = rng.normal(size=(3, 37)).astype(np.float32)
    m = rng.random((3, 37)) < 0.5

    def loss(v, lam):
        adv, ret = gae(r, v, m, gamma=0.97, lam=lam, method=method)
        return jnp.sum(adv ** 2) + jnp.sum(ret)

    grads = jax.grad(loss, argnums=(0, 1))(v, 0.9)
    ref = jax.grad(loss_scan := (lambda v, lam: jnp.sum(
        gae(r, v, m, gamma=0.97, lam=lam, method="scan")[0] ** 2)
        + jnp.sum(gae(r, v, m, gamma=0.97, lam=lam, method="scan")[1])), argnums=(0, 1))(v, 0.9)
    del loss_scan
    np.testing.assert_allclose(grads[0], ref[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grads[1], ref[1], rtol=1e-4, atol=1e-4)
    moved_grad = jax.grad(lambda r: relocate_rewards(r, m)[0].sum())(r)
    np.testing.assert_array_equal(moved_grad, (np.cumsum(m, axis=1) > 0).astype(np.float32))


def test_gae_and_relocation_under_x64():
    rng = np.random.default_rng(5)
    r, v = rng.normal(size=(2, 70)), rng.normal(size=(2, 70))
    m = rng.random((2, 70)) < 0.5
    with jax.enable_x64(True):
        adv, _ = gae(r, v, m, gamma=0.9, lam=0.8)
        moved, _ = relocate_rewards(r, m)
    ref_adv, _ = gae(r.astype(np.float32), v.astype(np.float32), m, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    assert moved.shape == r.shape


def test_gae_inside_shard_map_without_bootstrap():
    from jax.sharding import PartitionSpec as P
    devices = np.array(jax.devices()[:2])
    if len(devices) < 2:
        pytest.skip("needs 2 devices (tests/conftest.py sets 8 CPU devices)")
    mesh = jax.sharding.Mesh(devices, ("b",))
    rng = np.random.default_rng(6)
    r, v = rng.normal(size=(4, 40)).astype(np.float32), rng.normal(size=(4, 40)).astype(np.float32)
    m = rng.random((4, 40)) < 0.5
    for method in ("chunked", "associative", "scan"):
        fn = jax.jit(jax.shard_map(lambda r, v, m: gae(r, v, m, gamma=0.99, lam=0.95,
                                                       method=method),
                                   mesh=mesh, in_specs=P("b", None), out_specs=P("b", None)))
        adv, ret = fn(r, v, m)
        ref_adv, ref_ret = gae(r, v, m, gamma=0.99, lam=0.95, method=method)
        np.testing.assert_allclose(adv, ref_adv, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ret, ref_ret, rtol=1e-6, atol=1e-6)
