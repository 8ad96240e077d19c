"""One run, several learner processes: who does what, and how process 0's data reaches the others.

A multi-host learner is one JAX program started once per host
(``jax.distributed``; docs/multihost.md). Every process holds its part of
the mesh and runs every jitted step; process 0 (the *lead*) alone talks to
the rollout fleet, writes metrics and the summary, clears and marks the
publish directory and samples evaluations. What only the lead has reaches
the others through the collectives here, which every process must call at
the same point of the program:

* `BatchBroadcast` / `FollowerSource`: each batch of trajectories the lead
  takes from the fleet is sent, encoded (``sao.rpc.codec``), to every
  process, so every process builds the same host `TrainBatch` and places its
  own rows (``sao.learner.mesh.put_batch``). A failure on the lead (a fleet
  timeout) is sent too, and raised everywhere.
* `broadcast_bytes`, `broadcast_trajectories`, `broadcast_json`: the same for
  any payload (e.g. the lead's decision to evaluate or not).
* `gather_to_host`: a sharded pytree as full numpy arrays on every process
  (the lead's in-process evaluation engine samples with them).
* `sync`: a barrier on the coordinator's key-value store, which waits as
  long as it must (the lead may wait minutes for the fleet or sample an
  evaluation alone); every exchange after the lead worked alone starts with
  one, so the collectives that follow find all processes there.

With one process every function is a local no-op.
"""
from __future__ import annotations

import json
import struct
from typing import Callable, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from orbax.checkpoint import multihost as orbax_multihost

from sao.rpc import codec
from sao.types import Trajectory

_LEN = struct.Struct("<Q")
_MIN_BUCKET = 1 << 12            # payloads are padded to powers of two: few compiled shapes
SYNC_TIMEOUT_S = 7 * 24 * 3600   # a barrier outwaits any fleet wait (a dead process ends the job)
_barriers = [0]                  # barrier names must be unique: every process counts alike


class LeadError(RuntimeError):
    """Raised on every process when the lead failed to produce a batch."""


def process_count() -> int:
    return jax.process_count()


def is_lead() -> bool:
    """True on process 0 (and in a single-process run)."""
    return jax.process_index() == 0


def sync(name: str, timeout_s: float = SYNC_TIMEOUT_S) -> None:
    """Barrier of all processes on the coordinator's key-value store (no-op with
    one); every process calls it at the same point with the same ``name``."""
    if jax.process_count() == 1:
        return
    _barriers[0] += 1
    orbax_multihost.sync_global_processes(f"sao-{name}-{_barriers[0]}", timeout=int(timeout_s),
                                          processes=set(range(jax.process_count())))


def _bucket(n: int) -> int:
    size = _MIN_BUCKET
    while size < n:
        size *= 2
    return size


def broadcast_bytes(data: bytes | None) -> bytes:
    """The lead's ``data`` on every process (collective; others pass None).

    The payload travels as u32 words padded to a power of two, so a run
    compiles the broadcast for a handful of sizes only.
    """
    if jax.process_count() == 1:
        return bytes(data or b"")
    lead = is_lead()
    if lead and data is None:
        raise ValueError("the lead must pass the bytes to broadcast")
    sync("broadcast")
    n = np.array([len(data) if lead else 0], np.int64)
    n = int(multihost_utils.broadcast_one_to_all(n)[0])
    words = _bucket(n) // 4
    buf = np.zeros(words * 4, np.uint8)
    if lead:
        buf[:n] = np.frombuffer(data, np.uint8)
    out = multihost_utils.broadcast_one_to_all(buf.view(np.uint32))
    return np.asarray(out, np.uint32).view(np.uint8)[:n].tobytes()


def encode_message(trajs: Sequence[Trajectory] | None, error: str = "") -> bytes:
    """JSON header (``{"n": count, "error": text}``) then length-prefixed codec bytes."""
    parts = [codec.encode(t) for t in trajs or ()]
    head = json.dumps({"n": len(parts), "error": error}).encode()
    return b"".join([_LEN.pack(len(head)), head] + [_LEN.pack(len(p)) + p for p in parts])


def decode_message(data: bytes) -> tuple[list[Trajectory], str]:
    """Inverse of `encode_message`: ``(trajectories, error)``."""
    (k,), pos = _LEN.unpack_from(data, 0), _LEN.size
    head = json.loads(data[pos:pos + k])
    pos += k
    out = []
    for _ in range(head["n"]):
        (k,) = _LEN.unpack_from(data, pos)
        pos += _LEN.size
        out.append(codec.decode(data[pos:pos + k]))
        pos += k
    return out, head["error"]


def broadcast_trajectories(trajs: Sequence[Trajectory] | None, error: str = "") -> list[Trajectory]:
    """The lead's trajectories on every process (collective; others pass None).

    Raises LeadError on every process when the lead passes ``error``.
    """
    if jax.process_count() == 1:
        if error:
            raise LeadError(error)
        return list(trajs or ())
    out, err = decode_message(broadcast_bytes(encode_message(trajs, error) if is_lead() else None))
    if err:
        raise LeadError(f"process 0: {err}")
    return out


def broadcast_json(obj):
    """The lead's JSON-able ``obj`` on every process (collective; others pass anything)."""
    if jax.process_count() == 1:
        return obj
    data = json.dumps(obj).encode() if is_lead() else None
    return json.loads(broadcast_bytes(data))


class BatchBroadcast:
    """The lead's ``next_batch(timeout)`` (a dispatcher's ``get_batch`` or a
    ``GroupBatcher``) whose every batch, empty end-of-prompts included, is also
    sent to the other processes (`FollowerSource` receives it). An exception
    is sent as text, then re-raised on the lead."""

    def __init__(self, next_batch: Callable[[float | None], list[Trajectory]]):
        self.next_batch = next_batch

    def __call__(self, timeout: float | None = None) -> list[Trajectory]:
        try:
            trajs = self.next_batch(timeout)
        except Exception as e:
            if jax.process_count() > 1:
                broadcast_bytes(encode_message(None, f"{type(e).__name__}: {e}"))
            raise
        return broadcast_trajectories(trajs)


class FollowerSource:
    """The trajectory source of processes 1..N-1 (``sao.rl_loop.TrajectorySource``):
    batches come from the lead's `BatchBroadcast`; pushes and fleet counters
    are the lead's business."""

    learner_version = 0

    def get_batch(self, timeout: float | None = None) -> list[Trajectory]:
        """The lead's next batch; raises LeadError if the lead failed."""
        return broadcast_trajectories(None)

    def push_weights(self, version: int, uri: str, timeout: float | None = None) -> dict:
        self.learner_version = int(version)
        return {}

    def snapshot(self) -> dict:
        return {}


def gather_to_host(tree):
    """Every leaf of a (sharded, possibly multi-process) pytree as a full numpy
    array on every process (collective)."""
    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, jax.device_get(tree))
    sync("gather")
    return multihost_utils.process_allgather(tree, tiled=True)
