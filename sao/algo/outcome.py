"""Outcome (sequence-level) advantages: GRPO family, running-mean baselines,
REINFORCE++ returns, and the broadcast of outcome advantages onto tokens.

docs/algorithm.md §7 baselines. Sequence-level inputs are ``f32[N]`` (one reward
per trajectory); group ids are integers (any values, any order). Everything is
jit-compatible; string options (``scale``) are static.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sao.algo.masked import as_f32, as_mask, masked_whiten
from sao.algo.skip_gae import gae

Array = jax.Array
GRPO_SCALES = ("std", "none")


def _group_stats(rewards: Array, group_ids: Array):
    """Per-element group mean, population std, size and spread (f32[N] each).

    ``spread = max - min`` of the group is exact, so an all-equal group is
    recognised even when f32 rounding of the mean leaves a std of a few ulps
    (e.g. three rewards of 100.3 give std ~8e-6 > 1e-6).
    """
    n = rewards.shape[0]
    order = jnp.argsort(group_ids, stable=True)
    sorted_ids = group_ids[order]
    starts = jnp.concatenate([jnp.ones((1,), bool), sorted_ids[1:] != sorted_ids[:-1]])
    seg_sorted = jnp.cumsum(starts) - 1
    seg = jnp.zeros((n,), jnp.int32).at[order].set(seg_sorted.astype(jnp.int32))
    size = jax.ops.segment_sum(jnp.ones((n,), jnp.float32), seg, num_segments=n)[seg]
    mean = jax.ops.segment_sum(rewards, seg, num_segments=n)[seg] / size
    centred = rewards - mean
    var = jax.ops.segment_sum(centred * centred, seg, num_segments=n)[seg] / size
    spread = (jax.ops.segment_max(rewards, seg, num_segments=n)[seg]
              - jax.ops.segment_min(rewards, seg, num_segments=n)[seg])
    return mean, jnp.sqrt(var), size, spread


def _check_outcome(rewards, group_ids):
    if jnp.ndim(rewards) != 1 or jnp.shape(group_ids) != jnp.shape(rewards):
        raise ValueError("rewards must be f32[N] and group_ids i32[N], got shapes "
                         f"{jnp.shape(rewards)} and {jnp.shape(group_ids)}")


def grpo_advantages(rewards, group_ids, *, scale: str = "std", eps: float = 1e-6) -> Array:
    """Group-normalised outcome advantages (GRPO; Dr.GRPO with ``scale="none"``).

    ``A_i = (R_i - mean_g) / (std_g + eps)`` with the population std of the
    group (``scale="std"``), or ``A_i = R_i - mean_g`` (``scale="none"``,
    Dr.GRPO). A group of size 1, or whose std is below ``eps``, gets 0 (never
    NaN) in both modes; so does a group whose rewards are all equal, even when
    f32 rounding of a large mean would leave a std of a few ulps.

    Args:
      rewards: f32[N] one scalar reward per trajectory.
      group_ids: int[N] prompt/group id of each trajectory (any values).
      scale: ``"std"`` or ``"none"``.
      eps: std floor and denominator epsilon.

    Returns:
      f32[N] advantages.

    Raises:
      ValueError: on shape mismatch or unknown ``scale``.
    """
    if scale not in GRPO_SCALES:
        raise ValueError(f"unknown GRPO scale {scale!r}; valid: {GRPO_SCALES}")
    _check_outcome(rewards, group_ids)
    rewards = as_f32(rewards)
    mean, std, size, spread = _group_stats(rewards, jnp.asarray(group_ids))
    centred = rewards - mean
    adv = centred / (std + eps) if scale == "std" else centred
    return jnp.where((size > 1) & (std >= eps) & (spread > 0), adv, 0.0)


def dr_grpo_advantages(rewards, group_ids, *, eps: float = 1e-6) -> Array:
    """Dr.GRPO: ``R_i - mean_g`` (no std division); see :func:`grpo_advantages`."""
    return grpo_advantages(rewards, group_ids, scale="none", eps=eps)


def rloo_advantages(rewards, group_ids) -> Array:
    """REINFORCE leave-one-out: ``A_i = R_i - mean_{j != i in group} R_j``.

    Equals ``G / (G - 1) * (R_i - mean_g)`` for a group of size G; groups of
    size 1 get 0. ``rewards: f32[N]``, ``group_ids: int[N]``; returns f32[N].
    Raises ValueError on shape mismatch.
    """
    _check_outcome(rewards, group_ids)
    rewards = as_f32(rewards)
    mean, _, size, spread = _group_stats(rewards, jnp.asarray(group_ids))
    adv = (rewards - mean) * size / jnp.maximum(size - 1.0, 1.0)
    return jnp.where((size > 1) & (spread > 0), adv, 0.0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RunningMeanState:
    """Ring buffers of recent rewards, one per slot (a small pytree).

    Attributes:
      rewards: f32[S, W] last W rewards of each slot (oldest overwritten).
      count: i32[S] rewards ever written to each slot.

    Per-prompt baseline: one slot per prompt (the caller maps prompt ids to
    slots), ``W = 8``. Online baseline: one slot for everything, ``W = 128``.
    """

    rewards: Array
    count: Array

    @classmethod
    def create(cls, num_slots: int, window: int) -> "RunningMeanState":
        """Empty state; raises ValueError unless both sizes are positive."""
        if num_slots < 1 or window < 1:
            raise ValueError(f"num_slots and window must be >= 1, got {num_slots}, {window}")
        return cls(jnp.zeros((num_slots, window), jnp.float32),
                   jnp.zeros((num_slots,), jnp.int32))

    def baseline(self, default: float = 0.0) -> Array:
        """f32[S] mean of each slot's stored rewards (``default`` if empty)."""
        window = self.rewards.shape[1]
        n = jnp.minimum(self.count, window)
        valid = jnp.arange(window)[None, :] < n[:, None]
        total = jnp.sum(jnp.where(valid, self.rewards, 0.0), axis=1)
        return jnp.where(n > 0, total / jnp.maximum(n, 1), default)


def running_mean_advantages(rewards, slots, state: RunningMeanState, *,
                            default_baseline: float = 0.0) -> tuple[Array, RunningMeanState]:
    """Single-rollout running-mean baseline: ``A_i = R_i - mean(history of slot_i)``.

    docs/algorithm.md §7 "running mean". The baseline of every trajectory in the
    batch is the mean of its slot's ring buffer *before* this batch (so a
    reward never baselines itself); a slot with no history uses
    ``default_baseline`` **[ours]**. The batch's rewards are then pushed into
    the buffers in order.

    Args:
      rewards: f32[N] outcome rewards.
      slots: int[N] ring-buffer slot of each trajectory (prompt slot for the
        per-prompt variant, all 0 for the online variant), in ``[0, S)``.
      state: :class:`RunningMeanState` with S slots.
      default_baseline: baseline for slots without history.

    Returns:
      ``(advantages f32[N], new_state)``.

    Raises:
      ValueError: on shape mismatch. Out-of-range slots are clamped by JAX
      indexing under jit; pass valid slots.
    """
    _check_outcome(rewards, slots)
    rewards = as_f32(rewards)
    slots = jnp.asarray(slots, jnp.int32)
    adv = rewards - state.baseline(default_baseline)[slots]
    window = state.rewards.shape[1]

    def push(carry, item):
        buf, count = carry
        reward, slot = item
        buf = buf.at[slot, count[slot] % window].set(reward)
        return (buf, count.at[slot].add(1)), None

    (buf, count), _ = jax.lax.scan(push, (state.rewards, state.count), (rewards, slots))
    return adv, RunningMeanState(buf, count)


def reinforce_pp_advantages(rewards, action_mask, *, gamma: float = 1.0,
                            whiten: bool = True) -> Array:
    """REINFORCE++ token advantages: discounted returns, then batch whitening.

    ``G_t = sum_{s >= t} gamma^{k(s) - k(t)} r_s`` over action tokens, where
    ``k`` counts action tokens: the return does **not** reset at observation
    tokens (an observation span is no step, as in skip-observation GAE; it is
    :func:`gae` with zero values and ``lam = 1``). Off-action rewards move to
    the preceding action token. With ``whiten`` the returns are whitened over
    all action tokens of the batch (:func:`masked_whiten`).

    ``rewards: f32[B, T]``, ``action_mask: bool[B, T]``; returns f32[B, T],
    zero off the action mask. Raises ValueError on shape mismatch.
    """
    returns, _ = gae(rewards, jnp.zeros(jnp.shape(rewards), jnp.float32), action_mask,
                     gamma=gamma, lam=1.0)
    return masked_whiten(returns, action_mask) if whiten else returns


def broadcast_to_actions(seq_values, action_mask) -> Array:
    """Broadcasts one value per sequence onto its action tokens.

    ``seq_values: f32[B]`` (e.g. GRPO advantages), ``action_mask: bool[B, T]``;
    returns f32[B, T], ``seq_values[b]`` on action tokens and 0 elsewhere.
    Raises ValueError if the batch sizes differ.
    """
    if jnp.ndim(action_mask) != 2 or jnp.shape(seq_values) != (jnp.shape(action_mask)[0],):
        raise ValueError(f"need seq_values f32[B] and action_mask [B, T], got "
                         f"{jnp.shape(seq_values)} and {jnp.shape(action_mask)}")
    return jnp.where(as_mask(action_mask), as_f32(seq_values)[:, None], 0.0)
