"""Sampling jobs: prompts the fleet answers once each, outside training.

A ``SampleJob`` is a list of prompts of which the learner wants one episode
each at a temperature of its own, with the weights the fleet holds now:
held-out evaluation (``eval.temperature``) and the critic's value-pretraining
samples when the engines are remote servers (``sao.evaluation.FleetSampler``).
The dispatcher (``Dispatcher.sample``) issues a job's leases ahead of training
leases on free worker capacity and outside the staleness budget; each lease
carries the job's temperature (``Lease.temperature``). Answers stay with the
job: they are never buffered for training and are counted apart from the
training counters (``FleetMetrics.sampled`` / ``sample_dropped`` /
``sample_failed``). Faults are handled as for training prompts: a lost
worker's job leases are issued again, a failed episode is tried up to
``max_attempts`` times. Not thread-safe: the dispatcher calls it under its lock.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from sao.fleet.leases import Lease, LeaseBook, issue_key, prompt_id_of
from sao.types import Trajectory


class SampleJob:
    """One episode for each of ``prompts``, at ``temperature``.

    Args:
      prompts: JSON-serialisable dicts, each issue named once: by its prompt id
        (``prompt_id`` or ``id``; else its position) and, when present, its
        ``epoch`` / ``group`` fields (``sao.fleet.leases.issue_key``), so k
        samples of one prompt are k records with ``group`` 0..k-1.
      temperature: sampling temperature of every episode (>= 0).
      max_attempts: issues of a prompt whose episode failed before giving up.
    Raises ValueError on no prompts, a repeated (prompt id, epoch, group) or a
    negative temperature.
    """

    def __init__(self, prompts: Sequence[dict], *, temperature: float, max_attempts: int):
        records = [{**p, "prompt_id": prompt_id_of(p, i)} for i, p in enumerate(prompts)]
        keys = [issue_key(r, i) for i, r in enumerate(records)]   # the book's own names
        if not records:
            raise ValueError("a sample job needs at least one prompt")
        if len(set(keys)) != len(keys):
            raise ValueError("sample job prompts must be distinct (prompt id, epoch, group); "
                             "give the samples of one prompt distinct 'group' fields")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.temperature = float(temperature)
        self.max_attempts = int(max_attempts)
        self.book = LeaseBook(records, temperature=self.temperature)
        self._index = {key: i for i, key in enumerate(keys)}
        self.results: list[Trajectory | None] = [None] * len(records)
        self.reasons: dict[int, str] = {}  # position -> why it has no trajectory
        self.settled = 0  # prompts with their outcome

    @property
    def finished(self) -> bool:
        """Every prompt has its outcome: a trajectory or a reason."""
        return self.settled == len(self.results)

    def owns(self, lease_id: str) -> bool:
        return self.book.knows(lease_id)

    def issue(self, link) -> Lease | None:
        """The job's next lease for ``link``; None when nothing is left to issue."""
        return self.book.issue(link)

    def settle(self, lease_id: str, traj: Trajectory | None, reason: str | None,
               error: str | None) -> str:
        """Records an answer to one of this job's leases; returns its outcome:
        ``"sampled"``, ``"retry"`` (issued again), ``"ignored"`` (a duplicate,
        or the prompt runs elsewhere), ``"failed"`` (``max_attempts`` used) or
        the drop ``reason`` (the trajectory failed validation)."""
        prompt_id, lease = self.book.settle(lease_id)
        if prompt_id is None or prompt_id in self.book.done:
            return "ignored"
        i = self._index[prompt_id]
        if error is not None:
            if lease is None or self.book.running(prompt_id):
                return "ignored"
            if self.book.attempts[prompt_id] < self.max_attempts:
                self.book.requeue(prompt_id, lease.prompt)
                return "retry"
            self._finish(prompt_id, i, None, f"episode_failed: {error}")
            return "failed"
        if traj is not None and reason is None:   # the prompt's own id, as in training
            traj.prompt_id, traj.epoch, traj.group = self.book.identity(prompt_id)
        self._finish(prompt_id, i, traj if reason is None else None, reason)
        return "sampled" if reason is None else reason

    def withdraw(self) -> list[Lease]:
        """Ends the job (e.g. a timeout): its outstanding leases, for the
        caller to cancel on their workers (none once ``finished``)."""
        withdrawn = []
        for prompt_id in self._index:
            if self.book.running(prompt_id):
                withdrawn += self.book.finish(prompt_id)
        return withdrawn

    def _finish(self, prompt_id: str, i: int, traj: Trajectory | None, reason: str | None) -> None:
        self.book.finish(prompt_id)
        self.results[i] = traj
        if reason is not None:
            self.reasons[i] = reason
        self.settled += 1


def issue_jobs(jobs: Sequence[SampleJob], links, free: Callable[[Any], int]) -> list[Lease]:
    """Leases of ``jobs`` (oldest first) while a link of ``links`` has capacity
    (``free(link)`` leases, counting those just issued); returns them to send."""
    issued = []
    for job in jobs:
        while links:
            link = max(links, key=free)
            lease = job.issue(link) if free(link) > 0 else None
            if lease is None:
                break
            issued.append(lease)
    return issued
