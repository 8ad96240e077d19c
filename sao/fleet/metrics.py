"""Fleet metrics kept by the dispatcher (not thread-safe: the dispatcher
calls them under its lock).

Names: ``queue_depth`` (trajectories buffered, waiting for the learner),
``prompts_in_flight``, ``staleness`` (histogram of lag in versions of the
trajectories handed to the learner), ``drops`` (count by reason: validation
reasons of ``sao.types.validate``, codec reasons, ``stale``, ``duplicate``,
``env_error``, ``episode_failed``, ``unknown_lease``, ``foreign_lease``,
``quarantined``), ``quarantined`` (workers quarantined: ``sao.fleet.health``),
``version_ahead`` (reports of weights newer than the learner's), ``learner_idle_fraction`` (time the
learner spent blocked in ``get_batch`` over time since its first batch; the
first fill of the pipeline is excluded), per-worker throughput, and the
sampling jobs' episodes apart from training (``sampled``: kept for the job,
``sample_dropped``: failed validation, ``sample_failed``: episode failed every
attempt; ``sao.fleet.sample_jobs``).
"""
from __future__ import annotations

import collections
import dataclasses
import time


@dataclasses.dataclass
class WorkerStats:
    trajectories: int = 0
    action_tokens: int = 0
    bytes: int = 0
    errors: int = 0
    connects: int = 0
    version: int = -1
    live: bool = False
    problem: str = ""  # why the worker cannot serve (rejected credentials, version); "" if none
    first_seen: float = dataclasses.field(default_factory=time.monotonic)

    def snapshot(self) -> dict:
        elapsed = max(time.monotonic() - self.first_seen, 1e-9)
        return {"live": self.live, "problem": self.problem, "version": self.version,
                "connects": self.connects,
                "trajectories": self.trajectories, "action_tokens": self.action_tokens,
                "errors": self.errors, "bytes": self.bytes,
                "trajectories_per_s": self.trajectories / elapsed,
                "action_tokens_per_s": self.action_tokens / elapsed}


class FleetMetrics:
    """Counters, the staleness histogram and learner idle time."""

    def __init__(self):
        self.drops: collections.Counter[str] = collections.Counter()
        self.staleness: collections.Counter[int] = collections.Counter()
        self.accepted = 0
        self.trained = 0
        self.reissued = 0
        self.episode_errors = 0
        self.quarantined = self.version_ahead = 0
        self.stale_buffered = 0  # accepted, then dropped as stale while buffered
        self.sampled = self.sample_dropped = self.sample_failed = 0
        self.workers: dict[str, WorkerStats] = {}
        self._first_batch_at: float | None = None
        self._idle_s = 0.0

    def drop(self, reason: str) -> None:
        self.drops[reason] += 1

    def sample_outcome(self, outcome: str) -> None:
        """Counts one answer to a sampling job (``SampleJob.settle``'s outcome)."""
        if outcome == "sampled":
            self.sampled += 1
        elif outcome == "failed":
            self.sample_failed += 1
        elif outcome not in ("retry", "ignored"):
            self.sample_dropped += 1

    def worker(self, address: str) -> WorkerStats:
        return self.workers.setdefault(address, WorkerStats())

    def batch_served(self, wait_s: float, lags: list[int]) -> None:
        """Records one ``get_batch``: seconds the learner waited, lags served."""
        now = time.monotonic()
        if self._first_batch_at is None:
            self._first_batch_at = now
        else:
            self._idle_s += wait_s
        self.trained += len(lags)
        self.staleness.update(lags)

    def idle_fraction(self) -> float:
        if self._first_batch_at is None:
            return 0.0
        total = time.monotonic() - self._first_batch_at
        return self._idle_s / total if total > 0 else 0.0

    def snapshot(self, *, queue_depth: int, prompts_in_flight: int, pending: int,
                 learner_version: int) -> dict:
        return {"queue_depth": queue_depth, "prompts_in_flight": prompts_in_flight,
                "pending_reissue": pending, "learner_version": learner_version,
                "accepted": self.accepted, "trained": self.trained, "reissued": self.reissued,
                "episode_errors": self.episode_errors, "drops": dict(self.drops),
                "quarantined": self.quarantined, "version_ahead": self.version_ahead,
                "stale_buffered": self.stale_buffered,
                "sampled": self.sampled, "sample_dropped": self.sample_dropped,
                "sample_failed": self.sample_failed,
                "dropped": sum(self.drops.values()),
                "staleness": dict(sorted(self.staleness.items())),
                "learner_idle_fraction": self.idle_fraction(),
                "workers": {a: w.snapshot() for a, w in self.workers.items()}}

    def state_dict(self) -> dict:
        return {"drops": dict(self.drops),
                "staleness": {str(k): v for k, v in self.staleness.items()},
                "accepted": self.accepted, "trained": self.trained, "reissued": self.reissued,
                "episode_errors": self.episode_errors, "quarantined": self.quarantined,
                "version_ahead": self.version_ahead, "stale_buffered": self.stale_buffered}

    def load_state_dict(self, state: dict) -> None:
        self.drops = collections.Counter(state.get("drops", {}))
        self.staleness = collections.Counter({int(k): v for k, v in
                                              state.get("staleness", {}).items()})
        for key in ("accepted", "trained", "reissued", "episode_errors", "quarantined",
                    "version_ahead", "stale_buffered"):
            setattr(self, key, int(state.get(key, 0)))
