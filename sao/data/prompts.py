"""Prompt pipelines with grain: deterministic, sharded, reshuffled per epoch, resumable.

Prompt records are the small JSON-able dicts of sao/envs/base.py
(``prompt_id``, ``task``, ``text``, ``entry``). A pipeline is::

    records -> MapDataset.source -> [shard_index::shard_count]
            -> .seed(seed).shuffle()   (a new permutation every epoch)
            -> .repeat(num_epochs)     (None: forever)
            -> + "epoch" field -> IterDataset -> iterator

The iterator's ``get_state()`` is a small JSON-able dict; ``set_state()`` on a
fresh iterator of the same pipeline resumes exactly where it was. Train and
held-out splits are chosen by a seeded hash of the prompt text, so they are
disjoint even when a generator repeats a question.

:class:`PromptStream` is what the learner's dispatcher leases from: every
record ``group_size`` times with a ``group`` field, so ``(prompt_id, epoch,
group)`` names one issue and ``prompt_id`` stays the prompt's own id.
"""
from __future__ import annotations

import hashlib
import json
import threading
from typing import Any, Iterable, Iterator, Mapping, Sequence

import grain

from sao.envs.base import check_prompt


def split_records(records: Sequence[Mapping[str, Any]], *, heldout_fraction: float,
                  seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Splits records into (train, held-out) by a seeded hash of their text.

    A record is held out when ``blake2b(seed, text) / 2**64 < heldout_fraction``:
    the split is deterministic, independent of record order, and identical
    questions always fall on the same side. Raises ValueError if the fraction
    is outside [0, 1] or a record is malformed.
    """
    if not 0.0 <= heldout_fraction <= 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1], got {heldout_fraction}")
    train, heldout = [], []
    for rec in records:
        check_prompt(rec)
        digest = hashlib.blake2b(f"{int(seed)}\0{rec['text']}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "big") / 2.0 ** 64
        (heldout if u < heldout_fraction else train).append(dict(rec))
    return train, heldout


def _with_epoch(shard_len: int):
    def add(index: int, record: dict[str, Any]) -> dict[str, Any]:
        return {**record, "epoch": index // shard_len}
    return add


def prompt_dataset(records: Sequence[Mapping[str, Any]], *, seed: int, shard_index: int = 0,
                   shard_count: int = 1, num_epochs: int | None = None,
                   shuffle: bool = True) -> grain.MapDataset:
    """A grain ``MapDataset`` of prompt records for one worker.

    Args:
      records: prompt records (validated; ``entry`` must be JSON-able).
      seed: shuffle seed; epoch ``e`` uses a permutation derived from (seed, e).
      shard_index, shard_count: this worker's shard (records
        ``shard_index::shard_count``); shards are disjoint and cover all records.
      num_epochs: passes over the shard; None repeats forever.
      shuffle: False keeps record order (evaluation).

    Elements are the records plus ``"epoch"`` (0-based pass number).
    Raises ValueError on a bad shard, an empty shard, or a malformed record.
    """
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        raise ValueError(f"need 0 <= shard_index < shard_count, got {shard_index}, {shard_count}")
    if num_epochs is not None and num_epochs < 1:
        raise ValueError(f"num_epochs must be >= 1 or None, got {num_epochs}")
    recs = []
    for rec in records:
        check_prompt(rec)
        recs.append(json.loads(json.dumps(dict(rec))))    # JSON-able, detached copies
    ids = [r["prompt_id"] for r in recs]
    if len(set(ids)) != len(ids):
        raise ValueError("prompt_ids must be unique")
    ds = grain.MapDataset.source(recs)[shard_index::shard_count]
    if len(ds) == 0:
        raise ValueError(f"shard {shard_index} of {shard_count} is empty ({len(recs)} records)")
    shard_len = len(ds)
    ds = ds.seed(int(seed))
    if shuffle:
        ds = ds.shuffle()
    ds = ds.repeat(num_epochs)
    return ds.map_with_index(_with_epoch(shard_len))


def prompt_iterator(records: Sequence[Mapping[str, Any]], *, seed: int, shard_index: int = 0,
                    shard_count: int = 1, num_epochs: int | None = None,
                    shuffle: bool = True, state: Mapping[str, Any] | None = None):
    """An iterator over ``prompt_dataset(...)``; resumes from ``state`` if given.

    The iterator has ``get_state() -> dict`` (JSON-able) and ``set_state(dict)``.
    Raises ValueError as ``prompt_dataset``.
    """
    ds = prompt_dataset(records, seed=seed, shard_index=shard_index, shard_count=shard_count,
                        num_epochs=num_epochs, shuffle=shuffle)
    it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))
    if state is not None:
        it.set_state(dict(state))
    return it


class PromptStream:
    """Thread-safe iterator of prompt records for the dispatcher, ``group_size`` issues per record.

    Args:
      iterator: a :func:`prompt_iterator` (records with ``epoch``; ``get_state()``).
      group_size: rollouts per prompt (1: single rollout; GRPO's G otherwise).
      records: the records of ``iterator`` (any iterable of records with
        ``prompt_id``): what :meth:`resample` issues again; None: no re-samples.

    Each record of ``iterator`` comes out ``group_size`` times in a row as
    ``{**record, "epoch": e, "group": j}`` for ``j = 0 .. group_size - 1``
    (``epoch`` 0 when the record has none). ``get_state()`` holds the
    iterator's position, the copies of the current record not yet handed
    out and the queued re-samples, so a restored stream (``set_state``)
    hands out the rest of a group, then the re-samples, before the next
    record. Raises ValueError if ``group_size`` < 1.
    """

    def __init__(self, iterator: Iterator[dict], group_size: int = 1,
                 records: Iterable[Mapping[str, Any]] | None = None):
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self._it, self._lock, self._group_size = iterator, threading.Lock(), group_size
        self._copies: list[dict] = []
        self._records = None if records is None else {str(r["prompt_id"]): r for r in records}
        self._resample: list[list] = []        # [prompt_id, epoch, attempt], oldest first

    def __iter__(self) -> "PromptStream":
        return self

    def __next__(self) -> dict:
        with self._lock:
            if not self._copies and self._resample:
                pid, epoch, attempt = self._resample.pop(0)
                rec, g = self._records[pid], self._group_size
                self._copies = [{**rec, "epoch": epoch, "group": attempt * g + j}
                                for j in range(g)]
            if not self._copies:
                rec = next(self._it)
                epoch = int(rec.get("epoch", 0))
                self._copies = [{**rec, "epoch": epoch, "group": j} for j in range(self._group_size)]
            return self._copies.pop(0)

    def resample(self, prompt_id: str, epoch: int, attempt: int) -> bool:
        """Queues ``prompt_id`` to be issued again as a fresh group, ahead of new records.

        The copies are ``{**record, "epoch": epoch, "group": attempt * group_size + j}``:
        another issue (``sao.fleet.leases.issue_key``) of the same prompt id, whose group
        ``sao.rl_loop.GroupBatcher`` keys apart by ``group // group_size``. Returns False
        (nothing queued) when the stream has no ``records`` or not this prompt. Raises
        ValueError if ``attempt`` < 1 or ``epoch`` < 0 (attempt 0 is the first issue).
        """
        if int(attempt) < 1 or int(epoch) < 0:
            raise ValueError(f"attempt must be >= 1 and epoch >= 0, got {attempt}, {epoch}")
        if self._records is None or str(prompt_id) not in self._records:
            return False
        with self._lock:
            self._resample.append([str(prompt_id), int(epoch), int(attempt)])
        return True

    def get_state(self) -> dict:
        """``{"iterator": position, "copies": [records not yet handed out],
        "resample": [[prompt_id, epoch, attempt], ...]}`` (JSON-able)."""
        with self._lock:
            return {"iterator": self._it.get_state(), "copies": [dict(c) for c in self._copies],
                    "resample": [list(r) for r in self._resample]}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Resumes from ``get_state()`` output (of a stream of the same
        pipeline); a bare iterator position (checkpoints that kept no copies)
        restores the position alone. Raises ValueError if ``copies`` is not a
        list of at most ``group_size`` records, or a queued re-sample names a
        prompt this stream's ``records`` lack."""
        if "iterator" not in state or "copies" not in state:
            state = {"iterator": state, "copies": []}
        copies = state["copies"]
        if not isinstance(copies, list) or len(copies) > self._group_size or not all(
                isinstance(c, dict) for c in copies):
            raise ValueError(f"copies must be a list of at most {self._group_size} records")
        resample = [[str(p), int(e), int(a)] for p, e, a in state.get("resample", [])]
        if resample and (self._records is None or
                         any(p not in self._records for p, _, _ in resample)):
            raise ValueError("a queued re-sample names a prompt this stream does not have")
        with self._lock:
            self._it.set_state(dict(state["iterator"]))
            self._copies = [dict(c) for c in copies]
            self._resample = resample
