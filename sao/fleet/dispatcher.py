"""Learner-side dispatcher: leases prompts to the fleet, buffers trajectories.

The dispatcher is the gRPC client of every rollout worker (one ``WorkerLink``
thread each). It streams prompt leases while the staleness budget allows
(``prompts in flight + buffered <= (tau + 1) x batch_size``, capped by each
worker's capacity) and accepts finished trajectories in completion order.
Each arriving trajectory gets exactly one outcome: accepted into the buffer,
or dropped with a reason (codec / ``sao.types.validate`` reasons, ``stale``
when ``learner_version - oldest action version > tau``, ``duplicate`` when its
prompt was already answered, ``env_error`` for ``finish == "error"`` (an
environment failure, not a zero reward; the prompt is not issued again),
``unknown_lease``, ``foreign_lease`` for an answer to a lease issued to another
worker, ``quarantined`` for one from a quarantined worker; the checks are
``sao.fleet.intake``'s). The learner pulls batches
with ``get_batch``; after each published step it calls ``push_weights``.

Between a ``get_batch`` and the next ``push_weights`` (or ``get_batch``) the
budget is one batch smaller: prompts issued then run on weights one version
older than the learner's next step, so a prompt that finishes promptly is
trained within tau versions; only episodes that outlast tau learner steps are
dropped as stale (the filter guarantees lag <= tau for all). Synchronous RL is the same code with ``tau=0``: the budget is then
zero until the learner has pushed its new weights (and every worker has
acknowledged them), so each batch of B prompts is generated entirely by the
weights of the previous step and awaited as a whole (a barrier).

Faults: a worker whose stream breaks loses its leases, which go back to the
front of the queue for live workers (an answer it still sends first wins). A
worker holding a lease older than ``lease_timeout_s`` (hung, or far too slow)
is quarantined (``quarantine``: marked unhealthy for the rest of the run, its
prompts issued again to the others); so is one that reports weights newer than
the learner's (someone else pushed them), and, with a log-prob parity gate
(``config.parity``, ``sao.fleet.parity``), one whose log-probs of a probe set
differ from the learner's as it joins or after a weight push. ``state_dict`` /
``load_state_dict`` carry the buffer, the prompts to re-issue and the prompt
source's position (when it has ``get_state`` / ``set_state``, as
``sao.data.prompts.PromptStream``: the rest of a GRPO group included) across a
learner restart, all taken under one lock.

Unusable workers (rejected credentials, weights ahead of the learner, an engine
that gave up) are tracked by ``sao.fleet.roster``: when none can serve, or more
than ``max_broken_workers`` broke, ``get_batch``, ``push_weights`` and
``sample`` raise ``FleetError`` naming them instead of blocking.

Sampling outside training (``sample``: held-out evaluation, value-pretraining
data): ``sao.fleet.sample_jobs``. Settings: ``sao.fleet.dispatch_config``.
"""
from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from typing import Iterable

from sao.fleet import intake, lag_sources, staleness
from sao.fleet.dispatch_config import DispatcherConfig, FleetError
from sao.fleet.health import Health
from sao.fleet.leases import Lease, LeaseBook, requests_by_link
from sao.fleet.link import WorkerLink
from sao.fleet.metrics import FleetMetrics
from sao.fleet.parity import ParityHooks
from sao.fleet.roster import Roster
from sao.fleet.sample_jobs import SampleJob, issue_jobs
from sao.rpc import sao_pb2
from sao.types import Trajectory


class Dispatcher(Health, ParityHooks):
    """Client of the rollout fleet; thread-safe; use as a context manager.

    Args:
      workers: ``host:port`` addresses (more with ``add_worker``).
      prompts: iterable of JSON-serialisable dicts; ``prompt_id`` (or ``id``)
        names a prompt, else one is assigned in order.
      config: ``DispatcherConfig``.
    """

    def __init__(self, workers: Iterable[str], prompts: Iterable[dict], config: DispatcherConfig):
        self.config = config
        self._book = LeaseBook(prompts)
        self._cv = threading.Condition()
        self._links: dict[str, WorkerLink] = {}
        self._live: dict[WorkerLink, int] = {}           # joined link -> capacity
        self._buffer: collections.deque[Trajectory] = collections.deque()
        self._buffer_checked_at: int | None = None
        self._version = config.initial_version
        self._weights: tuple[int, str] | None = None
        self._awaiting_push = False  # a batch was served, its step not yet published
        self._roster = Roster()  # workers that cannot serve now, and why
        self._quarantined: set[WorkerLink] = set()
        self._jobs: list[SampleJob] = []  # sampling outside training, oldest first
        self.metrics = FleetMetrics()
        self._started = False
        for address in workers:
            self.add_worker(address)

    # -- lifecycle ----------------------------------------------------------
    def add_worker(self, address: str) -> None:
        """Connects to another worker (now if started, else on ``start``)."""
        with self._cv:
            if address in self._links:
                return
            link = WorkerLink(address, self, self.config.security,
                              capacity=self.config.capacity_per_worker,
                              reconnect_s=self.config.reconnect_s,
                              rpc_timeout_s=self.config.rpc_timeout_s,
                              weights_timeout_s=self.config.weights_timeout_s,
                              max_weight_failures=self.config.max_weight_failures)
            self._links[address] = link
            self.metrics.worker(address)
            if self._started:
                link.start()

    def start(self) -> "Dispatcher":
        with self._cv:
            self._started = True
            links = list(self._links.values())
        for link in links:
            link.start()
        return self

    def close(self) -> None:
        """Ends every stream and joins the link threads."""
        with self._cv:
            links = list(self._links.values())
        for link in links:
            link.close()

    def __enter__(self) -> "Dispatcher":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- learner API ----------------------------------------------------------
    @property
    def learner_version(self) -> int:
        return self._version

    def get_batch(self, timeout: float | None = None) -> list[Trajectory]:
        """Blocks until ``batch_size`` trajectories are ready; returns them in
        completion order. Returns fewer (possibly none) only once the prompt
        source is exhausted and nothing is left in flight. Raises TimeoutError
        after ``timeout`` seconds without a full batch, and ``FleetError`` when
        no worker is live and every worker is unusable (rejected credentials,
        weights newer than the learner's)."""
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        B = self.config.batch_size
        with self._cv:
            self._awaiting_push = False
            self._schedule()
            while True:
                self._drop_stale_buffered()
                if len(self._buffer) >= B or self._book.exhausted:
                    break
                self._raise_if_unserved()
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{len(self._buffer)}/{B} trajectories after {timeout}s")
                self._cv.wait(0.05)
                self._expire_overdue()
            batch = [self._buffer.popleft() for _ in range(min(B, len(self._buffer)))]
            self.metrics.batch_served(time.monotonic() - t0,
                                      [staleness.lag(t, self._version) for t in batch])
            self._awaiting_push = bool(batch)
        return batch

    def push_weights(self, version: int, uri: str, timeout: float | None = None) -> dict[str, object]:
        """Tells every live worker to load ``version`` from ``uri``; returns
        ``{address: version held now | error string}``. A worker that fails is
        reconnected (and synced on rejoin); workers joining later get the
        latest weights before any lease. Raises ValueError if ``version`` is
        lower than the current learner version, ``FleetError`` when too many
        workers broke."""
        with self._cv:
            self._roster.raise_if_broken(self.config.max_broken_workers)
            if version < self._version:
                raise ValueError(f"version {version} < learner version {self._version}")
            self._version, self._weights = int(version), (int(version), str(uri))
            for address in self._roster.caught_up(  # it rejoins on its next reconnect
                    self._version, lambda a: self.metrics.worker(a).version):
                self.metrics.worker(address).problem = ""
            links = list(self._live)
        results: dict[str, object] = {}
        try:
            if links:
                with concurrent.futures.ThreadPoolExecutor(len(links)) as pool:
                    futures = {pool.submit(self._load_verified, link, int(version), str(uri)):
                               link
                               for link in links}
                    for fut in concurrent.futures.as_completed(futures, timeout=timeout):
                        link, r = futures[fut], fut.result()
                        results[link.address] = r.version if r.ok else r.error
                        with self._cv:
                            if r.ok:
                                self.metrics.worker(link.address).version = r.version
                            self._check_version(link, r.version)  # pushed ahead by another
                            reset = not r.ok and link not in self._quarantined
                        if reset:
                            link.reset()
        finally:
            with self._cv:  # only now may the next batch's prompts go out
                self._awaiting_push = False
                self._schedule()
        return results

    def sample(self, prompts: list[dict], *, temperature: float,
               timeout: float | None = None) -> list[Trajectory | None]:
        """One episode per prompt at ``temperature`` with the weights the fleet
        holds now (the latest ``push_weights``), never trained on
        (``sao.fleet.sample_jobs``); blocks until each prompt has its outcome.

        Returns the trajectories in prompt order, None where an episode failed
        ``max_attempts`` times or its trajectory failed validation. Raises
        ValueError as ``SampleJob``, TimeoutError after ``timeout`` seconds
        (the job's leases are cancelled), ``FleetError`` as ``get_batch``.
        """
        job = SampleJob(prompts, temperature=temperature, max_attempts=self.config.max_attempts)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            self._jobs.append(job)
            try:
                self._schedule()
                while not job.finished:
                    self._raise_if_unserved()
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError(f"sampling: {job.settled}/{len(job.results)} "
                                           f"prompts answered after {timeout}s")
                    self._cv.wait(0.05)
                    self._expire_overdue()
            finally:
                self._jobs.remove(job)
                self._cancel(job.withdraw())  # nothing once finished
                self._schedule()  # the job's capacity goes back to training
        return job.results

    def snapshot(self) -> dict:
        """Metrics (see ``sao.fleet.metrics``) as a plain dict."""
        with self._cv:
            snap = self.metrics.snapshot(queue_depth=len(self._buffer),
                                         prompts_in_flight=self._book.in_flight,
                                         pending=self._book.pending,
                                         learner_version=self._version)
            for address, link in self._links.items():
                snap["workers"][address]["leases"] = self._book.held_by(link)
            if self.config.parity is not None:  # per server: gaps of its latest check
                snap["parity"] = self.config.parity.snapshot()
            return snap

    # -- checkpointing --------------------------------------------------------
    def state_dict(self) -> dict:
        """JSON-serialisable state: version, weights, buffered trajectories,
        prompts to re-issue (in flight + pending), answered prompt ids, the
        prompt source's position (``LeaseBook.state_dict``)."""
        with self._cv:
            return {"version": self._version, "weights": self._weights,
                    "buffer": intake.encode_buffer(self._buffer),
                    "leases": self._book.state_dict(), "metrics": self.metrics.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restores ``state_dict()`` output; call before ``start``. Buffered
        trajectories come back (each checked again as on arrival: a row the
        current checks refuse, e.g. metadata off ``sao.types.METADATA_SCHEMA``
        saved by an older version, is dropped and counted), in-flight prompts
        are issued again."""
        with self._cv:
            if self._started:
                raise RuntimeError("load_state_dict must be called before start()")
            self._version = int(state["version"])
            self._weights = tuple(state["weights"]) if state.get("weights") else None
            self.metrics.load_state_dict(state.get("metrics", {}))
            self._buffer = collections.deque(intake.decode_buffer(
                state["buffer"], self.config, self._version, self.metrics.drop))
            self._book.load_state_dict(state["leases"])

    # -- link callbacks (link threads) -------------------------------------
    def latest_weights(self) -> tuple[int, str] | None:
        with self._cv:
            return self._weights

    def link_joined(self, link: WorkerLink, capacity: int, weights_version: int | None) -> bool:
        with self._cv:
            if link in self._quarantined:
                return False  # its link is retired: it stops
            current = None if self._weights is None else self._weights[0]
            if weights_version != current:
                return False  # published meanwhile: the link syncs again
            self._live[link] = capacity
            stats = self.metrics.worker(link.address)
            stats.live, stats.connects = True, stats.connects + 1
            if weights_version is not None:
                stats.version = weights_version
            self._schedule()
            self._cv.notify_all()
            return True

    def link_broken(self, link: WorkerLink, error: str) -> None:
        """The worker cannot serve again (its engine gave up, or its loads kept
        failing): the link has stopped for good."""
        with self._cv:
            self.metrics.worker(link.address).problem = self._roster.break_worker(
                link.address, error)
            self._cv.notify_all()

    def link_rejected(self, link: WorkerLink, error: str) -> None:
        """The worker refused the credentials: the link has stopped for good."""
        with self._cv:
            self.metrics.worker(link.address).problem = self._roster.reject(link.address, error)
            self._cv.notify_all()

    def link_usable(self, link: WorkerLink, worker_version: int) -> str | None:
        """Why the worker (holding ``worker_version``) cannot serve now, or None."""
        with self._cv:
            stats = self.metrics.worker(link.address)
            if link in self._quarantined:
                return stats.problem
            reason = self._roster.check(link.address, worker_version, self._version)
            if reason is None:
                if not self._roster.permanent(link.address):
                    stats.problem = ""
                return None
            stats.problem, stats.version = reason, worker_version
            self._cv.notify_all()
            return reason

    def link_lost(self, link: WorkerLink, error: str) -> None:
        with self._cv:
            self._live.pop(link, None)
            self.metrics.worker(link.address).live = False
            self.metrics.reissued += self._book.drop_link(link)
            for job in self._jobs:
                job.book.drop_link(link)
            self._schedule()
            self._cv.notify_all()

    def link_response(self, link: WorkerLink, response: sao_pb2.GenerateResponse) -> None:
        answers = intake.decode_answers(response)  # outside the lock
        with self._cv:
            stats = self.metrics.worker(link.address)
            stats.version = response.worker_version
            self._check_version(link, response.worker_version)
            for a in answers:
                stats.bytes += a.nbytes
                if link in self._quarantined:
                    self.metrics.drop("quarantined")
                else:
                    self._ingest(link, a.lease_id, a.traj, a.reason, a.error)
            self._schedule()
            self._cv.notify_all()

    # -- internals (hold self._cv) ---------------------------------------
    def _raise_if_unserved(self) -> None:
        self._roster.raise_if_broken(self.config.max_broken_workers)
        self._roster.raise_if_none_usable(self._links, any_live=bool(self._live))

    @staticmethod
    def _cancel(leases: list[Lease]) -> None:
        for lease in leases:
            lease.link.send(sao_pb2.GenerateRequest(cancel_lease_ids=[lease.lease_id]))

    def _finish_prompt(self, prompt_id: str) -> None:
        """Marks a prompt answered and cancels its other leases on their workers."""
        self._cancel(self._book.finish(prompt_id))

    def _ingest(self, link, lease_id, traj, reason, error) -> None:
        """Gives one arriving answer exactly one outcome (accepted or a drop reason)."""
        job = next((j for j in self._jobs if j.owns(lease_id)), None)
        holder = (job.book if job is not None else self._book).issued_to(lease_id)
        if holder is not None and holder is not link:  # only its holder may answer a lease
            self.metrics.drop("foreign_lease")
            return
        if job is not None:  # a sampling job keeps its answers, never the buffer
            reason = reason or (None if error is not None else
                                intake.check(traj, self.config, self._version))
            self.metrics.sample_outcome(job.settle(lease_id, traj, reason, error))
            return
        prompt_id, lease = self._book.settle(lease_id)
        stats = self.metrics.worker(link.address)
        if prompt_id is None:
            self.metrics.drop("unknown_lease")
            return
        if prompt_id in self._book.done:
            self.metrics.drop("duplicate")
            return
        if error is not None:
            stats.errors += 1
            self.metrics.episode_errors += 1
            if lease is None or self._book.running(prompt_id):
                return  # the prompt is already queued again or running elsewhere
            if self._book.attempts[prompt_id] < self.config.max_attempts:
                self._book.requeue(prompt_id, lease.prompt)
                self.metrics.reissued += 1
            else:
                self._finish_prompt(prompt_id)
                self.metrics.drop("episode_failed")
            return
        reason = reason or intake.refusal(traj, self.config, self._version)
        self._finish_prompt(prompt_id)
        if reason is not None:
            self.metrics.drop(reason)
            return
        traj.prompt_id, traj.epoch, traj.group = self._book.identity(prompt_id)
        lag_sources.stamp_arrival(traj, lease_id, lease, self._version)  # in flight / queued
        stats.trajectories += 1
        stats.action_tokens += traj.num_action_tokens
        self.metrics.accepted += 1
        self._buffer.append(traj)

    def _drop_stale_buffered(self) -> None:
        if not self._buffer or self._buffer_checked_at == self._version:
            return  # arrivals were checked at their version: re-check only when it moved
        self._buffer_checked_at = self._version
        keep = collections.deque()
        for t in self._buffer:
            if staleness.is_stale(t, self._version, self.config.tau):
                self.metrics.drop("stale")
                self.metrics.stale_buffered += 1
            else:
                keep.append(t)
        dropped, self._buffer = len(self._buffer) - len(keep), keep
        if dropped:  # their budget goes back to the fleet (nothing else may wake it)
            self._schedule()

    def _free(self, link: WorkerLink) -> int:
        return (self._live[link] - self._book.held_by(link)
                - sum(job.book.held_by(link) for job in self._jobs))

    @staticmethod
    def _send(leases: list[Lease]) -> None:
        for link, request in requests_by_link(leases):
            link.send(request)

    def _schedule(self) -> None:
        """Issues leases while the budget and worker capacity allow."""
        if not self._live:
            return
        issued = issue_jobs(self._jobs, self._live, self._free)  # outside the budget
        budget = self.config.budget - self._book.in_flight - len(self._buffer)
        if self._awaiting_push:
            budget -= self.config.batch_size
        while budget > 0:
            link = max(self._live, key=self._free)
            if self._free(link) <= 0:
                break
            lease = self._book.issue(link)
            if lease is None:
                break
            issued.append(lease)
            budget -= 1
        self._send(issued)
