"""Trajectory: the unit of data between the rollout fleet and the learner.

A trajectory is the token sequence ``prompt, a_0, o_0, a_1, ..., a_n`` exactly
as the engine saw it (token-in/token-out), with per-token annotations
(docs/algorithm.md §2). Arrays are numpy on the host; nothing here touches devices.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, Mapping

import numpy as np

Finish = Literal["stop", "length", "error"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "error")

# Rollout log-probs below this are refused (``logprob_out_of_range``): a float32
# sampler practically never draws a token this unlikely (at most vocab x e^-40
# per token), and in a ratio ``exp(logpi - logpi_rollout)`` a forged -1e30 is
# an inf that turns a GRPO gradient non-finite.
MIN_ROLLOUT_LOGPROB = -40.0
# Timings (seconds) outside [0, MAX_TIMING_S] are refused (``bad_timing``).
MAX_TIMING_S = 1e7

_COUNT = ("count", 0, 10**6)     # an int (not a bool) in [0, 10**6]
_FRACTION = ("number", 0.0, 1.0)  # an int, float or bool in [0, 1]
# Every metadata key the learner reads (sao.rl_loop.batch_metrics,
# sao.evaluation.pass_at_1, sao.envs.facts.env_metrics) and the agent loop writes,
# with its type and range; other keys pass unread. A key of DRIFT_KEYS present
# needs all of them (the drift env writes them together).
METADATA_SCHEMA: dict[str, tuple] = {
    "num_tool_calls": _COUNT, "num_turns": _COUNT, "tool_timeouts": _COUNT,
    "phase": _COUNT, "learner_step": ("count", 0, 2**31 - 1),
    "quality": _FRACTION, "style_ok": _FRACTION,
    "truncated": ("str", 0, 256), "error": ("str", 0, 65536),
}
DRIFT_KEYS = ("phase", "learner_step", "quality", "style_ok")


def _fits(value: Any, kind: str, low, high) -> bool:
    if kind == "str":
        return isinstance(value, str) and low <= len(value) <= high
    if kind == "count":
        return type(value) is int and low <= value <= high
    return (isinstance(value, (int, float)) and math.isfinite(value)
            and low <= value <= high)  # bool is an int: True / False are 1 / 0


def metadata_error(metadata: Any) -> str | None:
    """Checks trajectory metadata against ``METADATA_SCHEMA``; returns a
    reason (``bad_metadata_<key>``, or ``bad_metadata_drift`` when a drift key
    comes without the others) or None. Never raises."""
    if not isinstance(metadata, Mapping):
        return "bad_metadata_type"
    for key, (kind, low, high) in METADATA_SCHEMA.items():
        if key in metadata and not _fits(metadata[key], kind, low, high):
            return f"bad_metadata_{key}"
    present = [k in metadata for k in DRIFT_KEYS]
    if any(present) and not all(present):
        return "bad_metadata_drift"
    return None


def metadata_number(metadata: Any, key: str, default: float = 0.0) -> float:
    """``metadata[key]`` as a float when it is a finite number (bools count
    as 0 / 1), else ``default``: summaries of worker data never raise on it."""
    value = metadata.get(key, default) if isinstance(metadata, Mapping) else default
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return float(default)


@dataclasses.dataclass
class Trajectory:
    """One episode, one prompt (single rollout).

    Attributes:
      tokens: int32[T] token ids, prompt first, never re-tokenised.
      action_mask: bool[T], True on tokens the policy generated.
      rollout_logprobs: float32[T], log pi_rollout(token) at the sampling
        temperature, as reported by the engine; 0 where ``action_mask`` is False.
      policy_version: int32[T], learner version of the weights that generated
        each action token; on prompt / observation tokens the version current
        when they were appended (ignored by the learner).
      reward: scalar outcome reward; the learner places it on the last action
        token.
      finish: ``"stop"`` (terminal), ``"length"`` (truncated) or ``"error"``.
      prompt_id: id of the prompt record it answers (the same in every epoch).
      trajectory_id: unique id of this trajectory.
      metadata: JSON-serialisable environment facts (task name, correctness,
        number of tool calls, ...).
      timings: wall-clock seconds of phases (``generate_s``, ``tool_s``, ...).
      epoch: pass over the prompt set in which the prompt was issued (>= 0).
      group: index of this rollout among the ``group_size`` rollouts of its
        prompt in that epoch (GRPO groups); 0 with one rollout per prompt.
        ``(prompt_id, epoch)`` names a group, ``(prompt_id, epoch, group)`` one issue.
    """

    tokens: np.ndarray
    action_mask: np.ndarray
    rollout_logprobs: np.ndarray
    policy_version: np.ndarray
    reward: float
    finish: str
    prompt_id: str
    trajectory_id: str
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    epoch: int = 0
    group: int = 0

    def __post_init__(self):
        tokens = np.asarray(self.tokens)
        if tokens.size and tokens.dtype.kind not in "iub":
            if tokens.dtype.kind != "f" or not np.all(np.isfinite(tokens)) or np.any(tokens % 1):
                raise ValueError(f"tokens must be integer ids, got dtype {tokens.dtype}")
        if tokens.size and tokens.dtype.kind != "b" and (
                tokens.min() < np.iinfo(np.int32).min or tokens.max() > np.iinfo(np.int32).max):
            raise ValueError("tokens outside the int32 range (they would wrap silently)")
        self.tokens = tokens.astype(np.int32)
        self.action_mask = np.asarray(self.action_mask, dtype=bool)
        self.rollout_logprobs = np.asarray(self.rollout_logprobs, dtype=np.float32)
        self.policy_version = np.asarray(self.policy_version, dtype=np.int32)
        self.reward = float(self.reward)
        self.epoch, self.group = int(self.epoch), int(self.group)

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask.sum())

    def oldest_version(self) -> int:
        """Smallest policy version over action tokens (-1 if there are none)."""
        if not self.action_mask.any():
            return -1
        return int(self.policy_version[self.action_mask].min())


def validate(traj: Trajectory, *, vocab_size: int, learner_version: int | None = None,
             max_length: int | None = None, max_abs_reward: float | None = None,
             min_logprob: float | None = MIN_ROLLOUT_LOGPROB) -> str | None:
    """Checks a received trajectory; returns a rejection reason or None.

    Args:
      vocab_size: token ids must lie in ``[0, vocab_size)``.
      learner_version: action tokens may not carry a newer policy version.
      max_length: most tokens (prompt included); the learner's largest length
        bucket, which a longer trajectory cannot be padded into. None: no bound.
      max_abs_reward: bound on ``|reward|``; a finite but absurd reward would
        still move the policy (the critic's loss overflows first). None: no bound.
      min_logprob: smallest plausible rollout log-prob on an action token
        (``MIN_ROLLOUT_LOGPROB``). None: no bound.

    Reasons are short stable strings used as metric keys: ``length_mismatch``,
    ``empty``, ``too_long``, ``bad_token_id``, ``no_action_token``,
    ``nonfinite_logprob``, ``positive_logprob``, ``bad_finish``,
    ``nonfinite_reward``, ``reward_out_of_range``, ``future_version``,
    ``negative_version``, ``bad_shape``, ``logprob_out_of_range``,
    ``bad_timing``, and ``metadata_error``'s ``bad_metadata_<key>``.
    Never raises on a ``Trajectory`` (whatever a worker put in it).
    """
    arrays = (traj.tokens, traj.action_mask, traj.rollout_logprobs, traj.policy_version)
    if any(a.ndim != 1 for a in arrays):
        return "bad_shape"
    n = traj.tokens.shape[0]
    if any(a.shape[0] != n for a in arrays):
        return "length_mismatch"
    if n == 0:
        return "empty"
    if max_length is not None and n > max_length:
        return "too_long"
    if traj.tokens.min() < 0 or traj.tokens.max() >= vocab_size:
        return "bad_token_id"
    if traj.finish not in FINISH_REASONS:
        return "bad_finish"
    if not np.isfinite(traj.reward):
        return "nonfinite_reward"
    if max_abs_reward is not None and abs(traj.reward) > max_abs_reward:
        return "reward_out_of_range"
    mask = traj.action_mask
    if not mask.any():
        return "no_action_token"
    if not np.all(np.isfinite(traj.rollout_logprobs)):  # off the mask too: they should be 0
        return "nonfinite_logprob"
    lp = traj.rollout_logprobs[mask]
    if np.any(lp > 0.0):
        return "positive_logprob"
    if min_logprob is not None and np.any(lp < min_logprob):
        return "logprob_out_of_range"
    versions = traj.policy_version[mask]
    if versions.min() < 0:
        return "negative_version"
    if learner_version is not None and versions.max() > learner_version:
        return "future_version"
    timings = traj.timings if isinstance(traj.timings, Mapping) else {None: None}
    # ``fleet_*`` keys are the dispatcher's own stamps (sao.fleet.lag_sources, e.g. a Unix
    # time): it overwrites whatever a worker sent under them, so only the rest is checked
    # here (a restored buffer holds stamped rows).
    if not all(isinstance(v, (int, float)) and 0.0 <= v <= MAX_TIMING_S
               for k, v in timings.items() if not (isinstance(k, str) and k.startswith("fleet_"))):
        return "bad_timing"
    return metadata_error(traj.metadata)
