"""`TrainBatch`: trajectories padded to a bounded set of shapes.

The learner's jitted steps compile once per distinct ``[B, T]``. Trajectories
arrive with arbitrary lengths, so a batch is right-padded to the smallest of a
few fixed length buckets, and the batch dimension is padded to a fixed ``B``
with zero-weight rows (``row_mask`` = 0). A run therefore compiles each step at
most ``len(length_buckets)`` times.

Host side only (numpy); ``sao.learner.mesh.put_batch`` puts a batch on the
mesh.
"""
from __future__ import annotations

from collections.abc import Sequence

import flax.struct
import numpy as np

from sao.types import Trajectory


@flax.struct.dataclass
class TrainBatch:
    """A padded batch of trajectories (a pytree of arrays).

    Attributes:
        tokens: i32[B, T] token ids, right-padded with ``pad_id``.
        action_mask: bool[B, T], True on tokens the policy generated (False on
            prompt, observation and padding tokens, and on every token of a padding
            row).
        rollout_logprobs: f32[B, T], log pi_rollout(token) reported by the engine
            at the sampling temperature; 0 off the action mask.
        policy_version: i32[B, T], learner version that generated each token
            (-1 on padding).
        rewards: f32[B, T], the trajectory's scalar reward on its last action
            token, 0 elsewhere.
        row_mask: f32[B], 1 for a real trajectory, 0 for a padding row.
        truncated: bool[B], True when the trajectory finished with ``"length"``.
        lengths: i32[B], number of real tokens per row (0 for padding rows).
        group_ids: i32[B], index of the row's group among the batch's distinct
            ``(prompt_id, epoch)`` pairs (first appearance order): the rollouts of
            one prompt in one epoch; -1 for padding rows. Used by group (GRPO)
            advantages.
    """

    tokens: np.ndarray
    action_mask: np.ndarray
    rollout_logprobs: np.ndarray
    policy_version: np.ndarray
    rewards: np.ndarray
    row_mask: np.ndarray
    truncated: np.ndarray
    lengths: np.ndarray
    group_ids: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        """``(B, T)`` of the padded batch."""
        return tuple(self.tokens.shape)


def pick_bucket(length: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= ``length``.

    Raises:
        ValueError: if ``buckets`` is empty or ``length`` exceeds the largest.
    """
    if not buckets:
        raise ValueError("length_buckets is empty")
    for b in sorted(buckets):
        if length <= b:
            return int(b)
    raise ValueError(
            f"trajectory of {length} tokens exceeds the largest length bucket "
            f"{max(buckets)}; raise the bucket or cap the rollout length")


def make_train_batch(trajectories: Sequence[Trajectory], *,
                                          buckets: Sequence[int], batch_size: int,
                                          pad_id: int) -> TrainBatch:
    """Pads trajectories into a `TrainBatch` of shape ``[batch_size, bucket]``.

    Args:
        trajectories: 1..batch_size trajectories (``sao.types.Trajectory``),
            already validated by the receiver.
        buckets: allowed padded lengths T; the smallest one that fits the longest
            trajectory is used.
        batch_size: fixed B; missing rows are padding with ``row_mask`` = 0.
        pad_id: token id written into padding positions.

    Returns:
        A host-side `TrainBatch`. The reward goes on the last action token; a
        trajectory without any action token keeps all-zero masks and rewards (it
        contributes nothing to any loss).

    Raises:
        ValueError: on an empty list, more trajectories than ``batch_size``, a
            trajectory longer than every bucket, or per-token arrays whose lengths
            disagree.
    """
    n = len(trajectories)
    if n == 0:
        raise ValueError("make_train_batch needs at least one trajectory")
    if n > batch_size:
        raise ValueError(f"{n} trajectories do not fit batch_size={batch_size}")
    for i, tr in enumerate(trajectories):
        lens = {tr.tokens.shape[0], tr.action_mask.shape[0],
                        tr.rollout_logprobs.shape[0], tr.policy_version.shape[0]}
        if len(lens) != 1:
            raise ValueError(f"trajectory {i} ({tr.trajectory_id}): per-token "
                                              f"arrays have different lengths {sorted(lens)}")
    t = pick_bucket(max(tr.length for tr in trajectories), buckets)

    tokens = np.full((batch_size, t), pad_id, np.int32)
    action_mask = np.zeros((batch_size, t), bool)
    logprobs = np.zeros((batch_size, t), np.float32)
    versions = np.full((batch_size, t), -1, np.int32)
    rewards = np.zeros((batch_size, t), np.float32)
    row_mask = np.zeros((batch_size,), np.float32)
    truncated = np.zeros((batch_size,), bool)
    lengths = np.zeros((batch_size,), np.int32)
    group_ids = np.full((batch_size,), -1, np.int32)
    groups: dict[tuple[str, int], int] = {}

    for i, tr in enumerate(trajectories):
        L = tr.length
        tokens[i, :L] = tr.tokens
        action_mask[i, :L] = tr.action_mask
        logprobs[i, :L] = np.where(tr.action_mask, tr.rollout_logprobs, 0.0)
        versions[i, :L] = tr.policy_version
        row_mask[i] = 1.0
        truncated[i] = tr.finish == "length"
        lengths[i] = L
        group_ids[i] = groups.setdefault((tr.prompt_id, tr.epoch), len(groups))
        if tr.action_mask.any():
            last = int(np.flatnonzero(tr.action_mask)[-1])
            rewards[i, last] = tr.reward

    return TrainBatch(tokens=tokens, action_mask=action_mask,
                                        rollout_logprobs=logprobs, policy_version=versions,
                                        rewards=rewards, row_mask=row_mask, truncated=truncated,
                                        lengths=lengths, group_ids=group_ids)
