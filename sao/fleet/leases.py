"""Which prompt is where: the dispatcher's lease book.

A *lease* is one issue of a prompt to one worker (``lease_id`` unique per
issue and unguessable: 128 random bits from ``secrets``, so a worker cannot
name another's leases; the book remembers which worker each was issued to,
``issued_to``, and the dispatcher takes an answer only from that worker). The book tracks outstanding leases by worker and by prompt, the
queue of prompts to issue again (ahead of fresh ones from the source), how
often each prompt was issued, and which prompts are answered (``done``), so
that each prompt's trajectory is counted exactly once whatever the faults.
Not thread-safe: the dispatcher calls it under its lock.

A record with ``epoch`` / ``group`` fields (``sao.data.prompts.PromptStream``)
is one issue of ``(prompt id, epoch, group)``: the book names it by a key built
from the three (``issue_key``) and keeps the fields (``LeaseBook.identity``), so
answers carry them without anyone parsing the key.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import secrets
import time
from typing import Hashable, Iterable, Iterator

from sao.rpc import auth, sao_pb2


@dataclasses.dataclass
class Lease:
    lease_id: str
    prompt_id: str
    prompt: dict
    link: Hashable       # the worker connection holding it
    issued_at: float     # time.monotonic()
    seq: int = 0         # issue order
    temperature: float | None = None  # the episode's own (sampling jobs); None: the worker's

    def to_proto(self) -> sao_pb2.Lease:
        return sao_pb2.Lease(lease_id=self.lease_id, prompt_id=self.prompt_id,
                             prompt_json=json.dumps(self.prompt), temperature=self.temperature)


def requests_by_link(leases: Iterable[Lease]) -> list[tuple[Hashable, sao_pb2.GenerateRequest]]:
    """``(link, GenerateRequest)`` pairs carrying ``leases`` to their links,
    each request at most half of ``sao.rpc.auth.MAX_REQUEST_BYTES`` (what a
    worker accepts) unless one lease alone is larger (such a prompt record
    cannot be sent)."""
    by_link: dict[Hashable, list] = {}
    for lease in leases:
        by_link.setdefault(lease.link, []).append(lease.to_proto())
    out, cap = [], auth.MAX_REQUEST_BYTES // 2
    for link, protos in by_link.items():
        chunk, size = [], 0
        for p in protos:
            n = p.ByteSize() + 8
            if chunk and size + n > cap:
                out.append((link, sao_pb2.GenerateRequest(leases=chunk)))
                chunk, size = [], 0
            chunk.append(p)
            size += n
        out.append((link, sao_pb2.GenerateRequest(leases=chunk)))
    return out


def prompt_id_of(prompt: dict, n: int) -> str:
    """``prompt["prompt_id"]`` (or ``prompt["id"]``), else ``prompt-<n>``."""
    for key in ("prompt_id", "id"):
        if key in prompt:
            return str(prompt[key])
    return f"prompt-{n}"


def identity_of(prompt: dict, n: int) -> tuple[str, int, int]:
    """``(prompt id, epoch, group)`` of a record: `prompt_id_of`, and its
    ``epoch`` / ``group`` fields (0 when absent)."""
    return prompt_id_of(prompt, n), int(prompt.get("epoch", 0)), int(prompt.get("group", 0))


def issue_key(prompt: dict, n: int) -> str:
    """The book's name for the issue of a record: its prompt id when it has no
    ``epoch`` / ``group`` fields, else the JSON of `identity_of` (a dictionary
    key only, never parsed)."""
    if "epoch" not in prompt and "group" not in prompt:
        return prompt_id_of(prompt, n)
    return json.dumps(identity_of(prompt, n))


class LeaseBook:
    """Outstanding leases, the re-issue queue, attempts and answered prompts.

    Args:
      prompts: iterable of JSON-serialisable dicts, pulled lazily; raises
        TypeError (from ``issue``) on a non-dict.
      temperature: carried by every lease (``sao.fleet.sample_jobs``); None:
        the worker samples at its own.
    """

    def __init__(self, prompts: Iterable[dict], *, temperature: float | None = None):
        self.temperature = temperature
        self._source: Iterator[dict] = iter(prompts)
        self._source_n = 0
        self._source_done = False
        self._outstanding: dict[str, Lease] = {}
        self._lease_prompt: dict[str, str] = {}   # every lease ever issued
        self._lease_link: dict[str, Hashable] = {}  # ... and the worker it was issued to
        self._identity: dict[str, tuple[str, int, int]] = {}  # key -> (prompt id, epoch, group)
        self._by_prompt: dict[str, set[str]] = collections.defaultdict(set)
        self._by_link: dict[Hashable, set[str]] = collections.defaultdict(set)
        self._pending: collections.deque[tuple[str, dict]] = collections.deque()
        self.attempts: collections.Counter[str] = collections.Counter()
        self.done: set[str] = set()
        self._counter = itertools.count()

    # -- counts ---------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Prompts with at least one outstanding lease."""
        return len(self._by_prompt)

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def exhausted(self) -> bool:
        """Nothing left to issue and nothing outstanding."""
        return self._source_done and not self._pending and not self._by_prompt

    def held_by(self, link) -> int:
        return len(self._by_link.get(link, ()))

    def knows(self, lease_id: str) -> bool:
        """Whether ``lease_id`` was ever issued by this book."""
        return lease_id in self._lease_prompt

    def issued_to(self, lease_id: str):
        """The link ``lease_id`` was issued to (None if never issued here)."""
        return self._lease_link.get(lease_id)

    def running(self, prompt_id: str) -> bool:
        return bool(self._by_prompt.get(prompt_id))

    def identity(self, prompt_id: str) -> tuple[str, int, int]:
        """``(prompt id, epoch, group)`` of an issued key (``(key, 0, 0)`` for plain records)."""
        return self._identity.get(prompt_id, (prompt_id, 0, 0))

    # -- issuing ----------------------------------------------------------------
    def _next_prompt(self) -> tuple[str, dict] | None:
        while self._pending:
            prompt_id, prompt = self._pending.popleft()
            if prompt_id not in self.done:
                return prompt_id, prompt
        while not self._source_done:
            try:
                prompt = next(self._source)
            except StopIteration:
                self._source_done = True
                return None
            if not isinstance(prompt, dict):
                raise TypeError(f"prompts must be dicts, got {type(prompt).__name__}")
            prompt_id = issue_key(prompt, self._source_n)
            if prompt_id != prompt_id_of(prompt, self._source_n):
                self._identity[prompt_id] = identity_of(prompt, self._source_n)
            self._source_n += 1
            if prompt_id not in self.done:
                return prompt_id, prompt
        return None

    def _record(self, prompt_id: str, prompt: dict, link) -> Lease:
        seq = next(self._counter)
        lease = Lease(secrets.token_urlsafe(16), prompt_id, prompt, link, time.monotonic(), seq,
                      self.temperature)
        self.attempts[prompt_id] += 1
        self._outstanding[lease.lease_id] = lease
        self._lease_prompt[lease.lease_id] = prompt_id
        self._lease_link[lease.lease_id] = link
        self._by_prompt[prompt_id].add(lease.lease_id)
        self._by_link[link].add(lease.lease_id)
        return lease

    def issue(self, link) -> Lease | None:
        """Leases the next prompt (re-issues first) to ``link``; None if none is left."""
        item = self._next_prompt()
        return None if item is None else self._record(*item, link)

    def issue_again(self, lease: Lease, link) -> Lease:
        """A second concurrent lease of ``lease``'s prompt (speculative re-issue)."""
        return self._record(lease.prompt_id, lease.prompt, link)

    def overdue_links(self, timeout_s: float) -> set:
        """Links holding an outstanding lease issued ``timeout_s`` or more ago."""
        now = time.monotonic()
        return {l.link for l in self._outstanding.values() if now - l.issued_at >= timeout_s}

    # -- settling ---------------------------------------------------------------
    def _forget(self, lease: Lease) -> None:
        self._by_link[lease.link].discard(lease.lease_id)
        ids = self._by_prompt.get(lease.prompt_id)
        if ids is not None:
            ids.discard(lease.lease_id)
            if not ids:
                del self._by_prompt[lease.prompt_id]

    def settle(self, lease_id: str) -> tuple[str | None, Lease | None]:
        """An answer for ``lease_id`` arrived: returns its prompt id (None if the
        id was never issued here) and the lease if it was still outstanding."""
        lease = self._outstanding.pop(lease_id, None)
        if lease is not None:
            self._forget(lease)
        return self._lease_prompt.get(lease_id), lease

    def requeue(self, prompt_id: str, prompt: dict) -> None:
        """Issue this prompt again before any fresh one."""
        self._pending.appendleft((prompt_id, prompt))

    def finish(self, prompt_id: str) -> list[Lease]:
        """Marks the prompt answered; returns its other outstanding leases,
        now withdrawn (the caller cancels them on their workers)."""
        self.done.add(prompt_id)
        withdrawn = [self._outstanding.pop(i) for i in list(self._by_prompt.get(prompt_id, ()))]
        for lease in withdrawn:
            self._forget(lease)
        return withdrawn

    def withdraw_link(self, link) -> list[Lease]:
        """Withdraws (and returns) every lease ``link`` holds."""
        withdrawn = [self._outstanding.pop(i) for i in self._by_link.pop(link, ())
                     if i in self._outstanding]
        for lease in withdrawn:
            self._forget(lease)
        return withdrawn

    def requeue_withdrawn(self, withdrawn: list[Lease]) -> int:
        """Queues the prompts of ``withdrawn`` leases (those issued by this
        book, not answered, not running elsewhere) again, oldest first, ahead
        of everything queued; returns how many."""
        again, seen = [], set()
        for lease in sorted(withdrawn, key=lambda l: l.seq):
            pid = lease.prompt_id
            if (self._lease_link.get(lease.lease_id) is lease.link and pid not in self.done
                    and not self.running(pid) and pid not in seen):
                again.append(lease)
                seen.add(pid)
        for lease in reversed(again):
            self.requeue(lease.prompt_id, lease.prompt)
        return len(again)

    def drop_link(self, link) -> int:
        """Withdraws every lease ``link`` held; queues their prompts again
        (unless answered or running elsewhere); returns how many were queued."""
        return self.requeue_withdrawn(self.withdraw_link(link))

    # -- checkpointing ------------------------------------------------------------
    def state_dict(self) -> dict:
        """``[prompt_id, prompt]`` pairs to re-issue (outstanding, then queued),
        their identities, answered ids, attempts, and the source's position
        (its ``get_state()``, e.g. ``PromptStream``; None for a plain
        iterable); JSON-serialisable. Taken together, so no prompt is both
        in flight and still ahead in the source, or in neither."""
        reissue = [[pid, self._outstanding[next(iter(ids))].prompt]
                   for pid, ids in self._by_prompt.items()]
        reissue += [[pid, p] for pid, p in self._pending]
        identity = {pid: list(self._identity[pid]) for pid, _ in reissue if pid in self._identity}
        get_state = getattr(self._source, "get_state", None)
        return {"reissue": reissue, "identity": identity, "done": sorted(self.done),
                "attempts": dict(self.attempts), "source_n": self._source_n,
                "source": get_state() if get_state is not None else None}

    def load_state_dict(self, state: dict) -> None:
        """Restores ``state_dict()`` output; the source's position too when
        both the state and the source have one (``set_state``)."""
        set_state = getattr(self._source, "set_state", None)
        if state.get("source") is not None and set_state is not None:
            set_state(state["source"])
        self.done = set(state["done"])
        self.attempts = collections.Counter(state.get("attempts", {}))
        self._source_n = int(state.get("source_n", 0))
        self._pending = collections.deque((str(pid), p) for pid, p in state["reissue"])
        self._identity = {k: (str(v[0]), int(v[1]), int(v[2]))
                          for k, v in state.get("identity", {}).items()}
