"""Replay: record the ordered trajectory stream a learner trained on, re-feed it.

File format (append-only, little-endian), one record after another::

    u32 payload length | u8 kind | payload | u32 crc32(kind byte + payload)

kinds: ``T`` = one trajectory (``sao.rpc.codec`` bytes), ``B`` = end of a
batch (JSON ``{"step", "learner_version", "size"}``). A batch counts only
once its ``B`` record is complete, so a crash mid-batch loses that batch
alone: the reader stops at the first torn or corrupt record, and a writer
reopening the file truncates that tail before appending. Each batch is
flushed and fsync'ed.

``ReplaySource`` has the dispatcher's ``get_batch`` / ``push_weights`` /
``snapshot`` surface, so a deterministic learner fed from it instead of the
fleet repeats the recorded run bit for bit.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import struct
import zlib
from typing import Iterator

from sao.rpc import codec
from sao.types import Trajectory

_HEAD = struct.Struct("<IB")
_CRC = struct.Struct("<I")
TRAJ, BATCH = ord("T"), ord("B")
MAX_RECORD_BYTES = 1 << 30


@dataclasses.dataclass
class ReplayBatch:
    step: int
    learner_version: int
    trajectories: list[Trajectory]


def _records(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """Yields ``(end_offset, kind, payload)`` of intact records; stops at damage."""
    pos = 0
    while pos + _HEAD.size <= len(data):
        length, kind = _HEAD.unpack_from(data, pos)
        end = pos + _HEAD.size + length + _CRC.size
        if length > MAX_RECORD_BYTES or end > len(data):
            return
        payload = data[pos + _HEAD.size:end - _CRC.size]
        (crc,) = _CRC.unpack_from(data, end - _CRC.size)
        if crc != zlib.crc32(bytes([kind]) + payload) or kind not in (TRAJ, BATCH):
            return
        yield end, kind, payload
        pos = end


def read_batches(path: str | os.PathLike) -> Iterator[ReplayBatch]:
    """Complete batches of a replay file in order; raises CodecError on a
    trajectory that passed its checksum but does not decode (a writer bug)."""
    data = pathlib.Path(path).read_bytes()
    pending: list[bytes] = []
    for _, kind, payload in _records(data):
        if kind == TRAJ:
            pending.append(payload)
            continue
        meta = json.loads(payload)
        if meta["size"] != len(pending):
            raise ValueError(f"batch {meta['step']}: {len(pending)} trajectories, "
                             f"header says {meta['size']}")
        yield ReplayBatch(int(meta["step"]), int(meta["learner_version"]),
                          [codec.decode(p) for p in pending])
        pending = []


def _valid_length(data: bytes, max_batches: int | None = None) -> int:
    """Bytes up to the end of the last complete batch (of the first ``max_batches``)."""
    valid, batches = 0, 0
    for end, kind, _ in _records(data):
        if kind == BATCH:
            if max_batches is not None and batches >= max_batches:
                break
            valid, batches = end, batches + 1
    return valid


class ReplayWriter:
    """Appends batches to ``path`` (created if absent; a torn tail is cut).

    ``max_batches``: keep only the first N complete batches before appending
    (a learner resumed from its step-N checkpoint records from there on: what
    it trained on after that checkpoint is cut).
    """

    def __init__(self, path: str | os.PathLike, *, max_batches: int | None = None):
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(exist_ok=True)
        valid = _valid_length(self.path.read_bytes(), max_batches)
        self._f = open(self.path, "r+b")
        self._f.truncate(valid)
        self._f.seek(valid)
        self.steps = sum(1 for _ in read_batches(self.path))

    def _record(self, kind: int, payload: bytes) -> None:
        self._f.write(_HEAD.pack(len(payload), kind) + payload +
                      _CRC.pack(zlib.crc32(bytes([kind]) + payload)))

    def write_batch(self, trajectories: list[Trajectory], *, learner_version: int,
                    step: int | None = None) -> None:
        """Appends one batch, in the order the learner consumed it, durably."""
        for t in trajectories:
            self._record(TRAJ, codec.encode(t))
        step = self.steps if step is None else step
        self._record(BATCH, json.dumps({"step": step, "learner_version": learner_version,
                                        "size": len(trajectories)}).encode())
        self._f.flush()
        os.fsync(self._f.fileno())
        self.steps += 1

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "ReplayWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Recorder:
    """Wraps a batch source (a ``Dispatcher``) and records every batch it
    serves, with the learner version at that moment; other attributes pass
    through to the source."""

    def __init__(self, source, path: str | os.PathLike):
        self.source = source
        self.writer = ReplayWriter(path)

    def get_batch(self, timeout: float | None = None) -> list[Trajectory]:
        batch = self.source.get_batch(timeout)
        if batch:
            self.writer.write_batch(batch, learner_version=self.source.learner_version)
        return batch

    def close(self) -> None:
        self.writer.close()

    def __getattr__(self, name):
        return getattr(self.source, name)


class ReplaySource:
    """Feeds recorded batches back with the dispatcher's learner API.

    With ``strict`` (default), ``get_batch`` raises ValueError when the
    learner's version (from ``push_weights``) differs from the one recorded
    with the batch: the replayed run has diverged from the recorded one.
    """

    def __init__(self, path: str | os.PathLike, *, initial_version: int = 0, strict: bool = True):
        self._batches = iter(read_batches(path))
        self._version = initial_version
        self._strict = strict
        self.served = 0

    @property
    def learner_version(self) -> int:
        return self._version

    def get_batch(self, timeout: float | None = None) -> list[Trajectory]:
        """The next recorded batch; ``[]`` at the end of the file."""
        batch = next(self._batches, None)
        if batch is None:
            return []
        if self._strict and batch.learner_version != self._version:
            raise ValueError(f"replay diverged at step {batch.step}: learner version "
                             f"{self._version}, recorded {batch.learner_version}")
        self.served += 1
        return batch.trajectories

    def push_weights(self, version: int, uri: str, timeout: float | None = None) -> dict:
        self._version = int(version)
        return {}

    def snapshot(self) -> dict:
        return {"replayed_batches": self.served, "learner_version": self._version}
