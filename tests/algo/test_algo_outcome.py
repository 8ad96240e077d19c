"""Outcome advantages: GRPO / Dr.GRPO / RLOO, running means, REINFORCE++."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algo_reference import gae_loop, group_advantages_loop, running_mean_loop
from sao.algo import (RunningMeanState, broadcast_to_actions, dr_grpo_advantages,
                      grpo_advantages, masked_mean, masked_var, reinforce_pp_advantages,
                      rloo_advantages, running_mean_advantages)

REWARDS = np.array([1.0, 0.0, 0.5, 2.0, 2.0, 2.0, 3.0, 0.3, 0.7, -1.0], np.float32)
GROUPS = np.array([7, 7, 7, 3, 3, 3, 11, 42, 42, 42])  # unsorted ids, a singleton group


@pytest.mark.parametrize("mode", ["std", "none", "rloo"])
def test_group_advantages_match_loop(mode):
    fn = {"std": grpo_advantages, "none": dr_grpo_advantages, "rloo": rloo_advantages}[mode]
    perm = np.random.default_rng(0).permutation(len(REWARDS))
    adv = jax.jit(fn)(REWARDS[perm], GROUPS[perm])
    ref = group_advantages_loop(REWARDS[perm], GROUPS[perm], mode)
    np.testing.assert_allclose(adv, ref, rtol=1e-5, atol=1e-6)


def test_grpo_hand_computed_and_degenerate_groups():
    # Group {1, 0}: mean 0.5, population std 0.5 -> +-1 (minus eps effect).
    adv = grpo_advantages(np.array([1.0, 0.0, 4.0, 4.0, 4.0, 9.0], np.float32),
                          np.array([0, 0, 1, 1, 1, 2]))
    np.testing.assert_allclose(adv, [0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6), 0, 0, 0, 0],
                               rtol=1e-6)
    assert np.all(np.isfinite(adv))
    # An all-equal group whose f32 mean is inexact still gives exactly 0.
    same = np.full(3, 0.1, np.float32)
    np.testing.assert_array_equal(grpo_advantages(same, np.zeros(3, int)), 0.0)
    np.testing.assert_array_equal(dr_grpo_advantages(same, np.zeros(3, int)), 0.0)
    np.testing.assert_allclose(rloo_advantages(np.array([1.0, 0.0, 0.5], np.float32),
                                               np.zeros(3, int)), [0.75, -0.75, 0.0])


def test_group_advantages_bad_inputs():
    with pytest.raises(ValueError, match="scale"):
        grpo_advantages(REWARDS, GROUPS, scale="max")
    with pytest.raises(ValueError, match="shapes"):
        grpo_advantages(REWARDS, GROUPS[:3])


def test_running_mean_per_prompt_and_online_match_loop():
    rng = np.random.default_rng(1)
    batches = [rng.random(6).astype(np.float32) for _ in range(4)]
    slots = [rng.integers(0, 3, 6) for _ in range(4)]
    step = jax.jit(running_mean_advantages)
    for num_slots, window, slot_batches in ((3, 2, slots), (1, 5, [np.zeros(6, int)] * 4)):
        state = RunningMeanState.create(num_slots, window)
        ref = running_mean_loop(batches, slot_batches, window)
        for rewards, s, expect in zip(batches, slot_batches, ref):
            adv, state = step(rewards, s, state)
            np.testing.assert_allclose(adv, expect, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="num_slots"):
        RunningMeanState.create(0, 8)


def test_running_mean_default_baseline_for_unseen_prompt():
    state = RunningMeanState.create(2, 8)
    adv, state = running_mean_advantages(np.array([1.0, 3.0], np.float32), np.array([0, 0]),
                                         state, default_baseline=0.5)
    np.testing.assert_allclose(adv, [0.5, 2.5])
    adv, _ = running_mean_advantages(np.array([1.0], np.float32), np.array([0]), state)
    np.testing.assert_allclose(adv, [-1.0])  # baseline mean(1, 3) = 2


def test_reinforce_pp_returns_do_not_reset_at_observations():
    mask = np.array([[0, 1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0, 0]], bool)
    rewards = np.zeros((2, 7), np.float32)
    rewards[0, 5], rewards[1, 4] = 1.0, 2.0  # second reward sits after the last action
    ret = reinforce_pp_advantages(rewards, mask, gamma=0.5, whiten=False)
    np.testing.assert_allclose(ret, [[0, 0.25, 0.5, 0, 0, 1.0, 0], [2.0, 0, 0, 0, 0, 0, 0]])
    white = reinforce_pp_advantages(rewards, mask, gamma=0.5)
    np.testing.assert_allclose(masked_mean(white, mask), 0.0, atol=1e-6)
    np.testing.assert_allclose(masked_var(white, mask), 1.0, rtol=1e-5)
    rng = np.random.default_rng(2)
    r, m = rng.normal(size=(3, 20)).astype(np.float32), rng.random((3, 20)) < 0.5
    ref, _ = gae_loop(r, np.zeros_like(r), m, 0.9, 1.0)
    np.testing.assert_allclose(reinforce_pp_advantages(r, m, gamma=0.9, whiten=False), ref,
                               rtol=1e-5, atol=1e-5)


def test_broadcast_to_actions():
    mask = np.array([[0, 1, 1], [1, 0, 0]], bool)
    out = broadcast_to_actions(jnp.array([2.0, -1.0], jnp.bfloat16), mask)
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(out, [[0, 2, 2], [-1, 0, 0]])
    with pytest.raises(ValueError):
        broadcast_to_actions(np.zeros(3), mask)


@pytest.mark.parametrize("value,size", [(100.3, 3), (1000.7, 7), (12345.6, 3), (12345.6, 7)])
def test_all_equal_group_with_large_rewards_gives_zero(value, size):
    # f32 rounding of the mean leaves a std of a few ulps (> eps) for these.
    rewards = np.concatenate([np.full(size, value, np.float32), np.array([0.0, 1.0], np.float32)])
    groups = np.array([0] * size + [1, 1])
    for adv in (grpo_advantages(rewards, groups), dr_grpo_advantages(rewards, groups),
                rloo_advantages(rewards, groups)):
        adv = np.asarray(adv)
        np.testing.assert_array_equal(adv[:size], 0.0)
        assert adv[-2] < 0 < adv[-1]
