"""What the dispatcher accepts from a worker: decoding answers, the checks a
trajectory must pass, and the checkpointed buffer.

Everything a worker sends is untrusted. An answer becomes an ``Answer``
(decoded outside the dispatcher's lock); a trajectory is refused with one
short, stable reason, a metric key (``refusal``): the codec's
(``decode_error``, ``bad_dtype``, ``bad_shape``, ``bad_metadata``),
``sao.types.validate``'s (shapes, token ids, finish, reward, log-probs in
``[min_rollout_logprob, 0]``, versions, timings, and the metadata schema
``sao.types.METADATA_SCHEMA`` as ``bad_metadata_<key>``), ``env_error`` for
``finish == "error"`` and ``stale`` beyond tau. The same checks run again on
a restored checkpoint's buffer (``decode_buffer``): rows that an older version
of this code accepted and the current one refuses are dropped and counted, so
a checkpoint holding them resumes.
"""
from __future__ import annotations

import base64
import dataclasses
from typing import Callable, Iterable

from sao.fleet import staleness
from sao.rpc import codec, sao_pb2
from sao.types import Trajectory, validate


@dataclasses.dataclass
class Answer:
    """One ``Finished`` of a ``GenerateResponse``: a trajectory (or the codec's
    refusal ``reason``) or the worker's episode ``error``."""

    lease_id: str
    nbytes: int
    traj: Trajectory | None
    reason: str | None
    error: str | None


def decode_answers(response: sao_pb2.GenerateResponse) -> list[Answer]:
    """Decodes every answer of ``response``; never raises on its content."""
    out = []
    for f in response.finished:
        if f.WhichOneof("result") == "trajectory":
            traj, reason = codec.try_decode(f.trajectory)
            out.append(Answer(f.lease_id, len(f.trajectory), traj, reason, None))
        else:
            out.append(Answer(f.lease_id, 0, None, None, f.error or "empty result"))
    return out


def check(traj: Trajectory, config, learner_version: int) -> str | None:
    """``sao.types.validate`` with the dispatcher's bounds (``DispatcherConfig``)."""
    return validate(traj, vocab_size=config.vocab_size, learner_version=learner_version,
                    max_length=config.max_length, max_abs_reward=config.max_abs_reward,
                    min_logprob=config.min_rollout_logprob)


def refusal(traj: Trajectory, config, learner_version: int) -> str | None:
    """Why a decoded training trajectory is not trained on, or None: `check`,
    then ``env_error`` (an environment failure, not a zero reward), then
    ``stale`` (lag beyond ``config.tau``)."""
    reason = check(traj, config, learner_version)
    if reason is None and traj.finish == "error":
        reason = "env_error"
    if reason is None and staleness.is_stale(traj, learner_version, config.tau):
        reason = "stale"
    return reason


def encode_buffer(trajs: Iterable[Trajectory]) -> list[str]:
    """Buffered trajectories as base64 wire bytes (JSON-serialisable)."""
    return [base64.b64encode(codec.encode(t)).decode() for t in trajs]


def decode_buffer(rows: Iterable, config, learner_version: int,
                  drop: Callable[[str], None]) -> list[Trajectory]:
    """`encode_buffer` output back, each row checked as on arrival (`check`;
    ``decode_error`` for what is not base64 of a trajectory): a refused row
    is left out and ``drop(reason)`` called. Staleness is the dispatcher's
    next check. Never raises on the rows' content."""
    kept = []
    for row in rows:
        try:
            data = base64.b64decode(row, validate=True)
        except (TypeError, ValueError):
            drop("decode_error")
            continue
        traj, reason = codec.try_decode(data)
        reason = reason or check(traj, config, learner_version)
        if reason is not None:
            drop(reason)
        else:
            kept.append(traj)
    return kept
