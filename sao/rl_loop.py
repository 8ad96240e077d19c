"""The asynchronous RL loop (the paper's algorithm box).

    repeat for step = start .. steps - 1:
        collect B trajectories from the fleet, in completion order      (staleness ≤ τ, drops counted)
        update: critic values → skip-observation GAE → K critic steps → DIS actor step
        publish the new policy version and push it to every rollout worker
        every eval.every steps: held-out pass@1; every checkpoint.every steps: orbax checkpoint

The loop talks to one trajectory source (the dispatcher, or a replay) and does
everything else through :class:`LoopHooks`: where a batch comes from (whole
GRPO groups: :class:`GroupBatcher`), per-row advantages of a running-mean
baseline, extra batch metrics, publishing, evaluation, checkpoints, metric
records. Building the learner, the fleet and resuming is ``sao.train``.
"""
from __future__ import annotations

import base64
import collections
import dataclasses
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from sao import timing
from sao.fleet import staleness
from sao.learner.batch import make_train_batch
from sao.rpc import codec
from sao.types import Trajectory, metadata_number


class TrajectorySource(Protocol):
    """What the loop needs of the fleet: ``sao.fleet.Dispatcher`` or ``sao.fleet.replay.ReplaySource``."""

    def get_batch(self, timeout: float | None = None) -> list[Trajectory]: ...
    def push_weights(self, version: int, uri: str, timeout: float | None = None) -> dict: ...
    def snapshot(self) -> dict: ...


@dataclasses.dataclass
class LoopConfig:
    """Schedule of the loop (from the experiment config).

    Attributes:
      steps: total learner steps; ``push_every``: publish + push every N actor
      updates; ``eval_every`` / ``checkpoint_every``: in learner steps (0 =
      never); ``eval_offset``: learner steps before evaluations start counting
      (the critic warm-up, so that arms evaluate at equal actor updates:
      evaluation after step ``s`` when ``s - eval_offset`` is a positive
      multiple of ``eval_every``); ``batch_timeout_s``: give up when the fleet
      stalls this long.
    """

    steps: int
    push_every: int = 1
    eval_every: int = 0
    checkpoint_every: int = 0
    batch_timeout_s: float | None = None
    eval_offset: int = 0


def _no_metrics(*args) -> dict:
    return {}


def _nothing(*args) -> None:
    return None


@dataclasses.dataclass
class LoopHooks:
    """What the loop calls besides the learner and the source.

    Attributes:
      publish: ``publish(states, version) -> uri`` of a params checkpoint.
      write: ``write(step, metrics)``, one record per step; on a checkpoint step the
        record is written before the checkpoint and a second one with the step's
        ``time/...`` keys after it (readers merge records by step).
      evaluate: ``evaluate(states, step) -> {"eval/...": ...}``.
      checkpoint: ``checkpoint(states, step)`` saves a training checkpoint.
      on_step: ``on_step(step, metrics)`` after each step (progress display).
      next_batch: ``next_batch(timeout) -> trajectories``; None: ``source.get_batch``.
      advantages: ``advantages(trajs, B) -> f32[B]`` per-row advantages for
        ``advantage_estimator="given"`` (``sao.learner.baselines.RunningMeanBaseline``);
        None: the learner computes them.
      batch_metrics: ``batch_metrics(trajs) -> dict`` extra metrics of a batch
        (e.g. the drift env's ``env/...``).
    """

    publish: Callable[[Any, int], str]
    write: Callable[[int, dict], None] = _nothing
    evaluate: Callable[[Any, int], dict] = _no_metrics
    checkpoint: Callable[[Any, int], None] = _nothing
    on_step: Callable[[int, dict], None] = _nothing
    next_batch: Callable[[float | None], list[Trajectory]] | None = None
    advantages: Callable[[Sequence[Trajectory], int], np.ndarray] | None = None
    batch_metrics: Callable[[Sequence[Trajectory]], dict] = _no_metrics


class GroupBatcher:
    """GRPO batches: whole groups (``group_size`` rollouts of one prompt), each under the staleness bound.

    ``GroupBatcher(source.get_batch, ...)`` is a ``LoopHooks.next_batch``.
    Trajectories are held until their group is complete, then served
    ``batch_size // group_size`` groups at a time, so ``make_train_batch``
    gives a group one ``group_ids`` value. A group is keyed
    ``(prompt_id, epoch, group // group_size)``: the last part is the
    attempt (``sao.data.prompts.PromptStream.resample`` numbers the members
    of a re-sampled group ``attempt * group_size + j``).

    With ``version`` and ``tau`` (what ``sao.train.reinforce`` passes: the
    dispatcher's learner version and ``rollout.tau``) a group is a unit under
    the staleness bound: it is served only if every member's lag
    (``sao.fleet.staleness.lag``) is <= ``tau`` at batch time, and a group
    with a member beyond ``tau`` is dropped whole as soon as that is seen
    (lags only grow). This also ends a group that lost a member in the
    dispatcher (stale, invalid, failed: any reason): its held members pass
    ``tau`` within ``tau + 1`` versions. Members of a dropped group that
    arrive later are dropped on arrival (``groups/late_rows``). A dropped
    group's prompt is issued again as a fresh group through ``resample(prompt_id,
    epoch, attempt) -> bool`` (``PromptStream.resample``) until it has had
    ``max_attempts`` attempts (then ``groups/abandoned``). Without ``version``
    no lag is checked, and an incomplete group is only discarded after
    ``max_pending`` newer groups start (a safety bound in both modes).

    Every received row has one outcome: ``groups/rows_in = rows_served +
    dropped_rows + late_rows + held`` (``metrics``), and every dropped group
    is ``resampled`` or ``abandoned``. ``state_dict`` / ``load_state_dict``
    carry the held rows, the dropped keys and the counts across a checkpoint
    (the dispatcher's state holds the rest of each group: buffered, in
    flight, or not yet issued, with the prompt stream's re-sample queue).
    Raises ValueError unless ``group_size`` >= 2 divides ``batch_size``, or
    ``tau`` is missing (or < 0) when ``version`` is given.
    """

    COUNTERS = ("dropped_groups", "dropped_rows", "dropped_stale", "dropped_evicted", "late_rows",
                "resampled", "abandoned", "rows_in", "rows_served")

    def __init__(self, get_batch: Callable[[float | None], list[Trajectory]], *, group_size: int,
                 batch_size: int, max_pending: int = 1024, version: Callable[[], int] | None = None,
                 tau: int | None = None,
                 resample: Callable[[str, int, int], bool] | None = None, max_attempts: int = 3):
        if group_size < 2 or batch_size % group_size:
            raise ValueError(f"group_size {group_size} must be >= 2 and divide batch_size {batch_size}")
        if version is not None and (tau is None or tau < 0):
            raise ValueError(f"a staleness check needs tau >= 0, got {tau}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.get_batch, self.group_size = get_batch, group_size
        self.groups_per_batch, self.max_pending = batch_size // group_size, max_pending
        self.version, self.tau, self.resample, self.max_attempts = version, tau, resample, max_attempts
        self._pending: collections.OrderedDict[tuple, list] = collections.OrderedDict()
        self._ready: collections.deque[list] = collections.deque()
        self._dead: collections.OrderedDict[tuple, None] = collections.OrderedDict()
        self.counts = dict.fromkeys(self.COUNTERS, 0)

    # Backward-compatible names of the first two counters.
    @property
    def dropped_groups(self) -> int:
        return self.counts["dropped_groups"]

    @property
    def dropped_rows(self) -> int:
        return self.counts["dropped_rows"]

    def key(self, t: Trajectory) -> tuple[str, int, int]:
        """``(prompt_id, epoch, attempt)`` of a row's group."""
        return t.prompt_id, int(t.epoch), int(t.group) // self.group_size

    def __call__(self, timeout: float | None = None) -> list[Trajectory]:
        while True:
            self._drop_stale()
            if len(self._ready) >= self.groups_per_batch:
                break
            trajs = self.get_batch(timeout)
            if not trajs:
                return []
            for t in trajs:
                self.counts["rows_in"] += 1
                key = self.key(t)
                if key in self._dead:
                    self.counts["late_rows"] += 1
                    continue
                members = self._pending.setdefault(key, [])
                members.append(t)
                if len(members) == self.group_size:
                    self._ready.append(self._pending.pop(key))
            while len(self._pending) > self.max_pending:
                key, members = self._pending.popitem(last=False)
                self._drop(key, members, "dropped_evicted")
        out = [t for _ in range(self.groups_per_batch) for t in self._ready.popleft()]
        self.counts["rows_served"] += len(out)
        return out

    def _drop_stale(self) -> None:
        """Drops, whole, every held group with a member beyond ``tau`` now."""
        if self.version is None:
            return
        v = int(self.version())

        def stale(members):
            return any(staleness.is_stale(t, v, self.tau) for t in members)
        for key in [k for k, m in self._pending.items() if stale(m)]:
            self._drop(key, self._pending.pop(key), "dropped_stale")
        keep = collections.deque()
        for members in self._ready:
            if stale(members):
                self._drop(self.key(members[0]), members, "dropped_stale")
            else:
                keep.append(members)
        self._ready = keep

    def _drop(self, key: tuple, members: list, reason: str) -> None:
        c = self.counts
        c["dropped_groups"] += 1
        c["dropped_rows"] += len(members)
        c[reason] += 1
        self._dead[key] = None
        while len(self._dead) > 4 * self.max_pending:
            self._dead.popitem(last=False)
        prompt_id, epoch, attempt = key
        if (self.resample is not None and attempt + 1 < self.max_attempts
                and self.resample(prompt_id, epoch, attempt + 1)):
            c["resampled"] += 1
        else:
            c["abandoned"] += 1

    def held_rows(self) -> int:
        return sum(map(len, self._pending.values())) + sum(map(len, self._ready))

    def metrics(self) -> dict[str, int]:
        """Cumulative over resumes: ``groups/dropped`` (groups dropped whole) and their rows
        ``groups/dropped_rows``, of which ``groups/dropped_stale`` (a member beyond tau) and
        ``groups/dropped_evicted`` (incomplete after ``max_pending`` newer groups);
        ``groups/late_rows`` (rows of an already dropped group), ``groups/resampled`` /
        ``groups/abandoned`` (what became of each dropped group's prompt), ``groups/rows_in``
        and ``groups/rows_served``; held now: ``groups/pending`` (incomplete groups),
        ``groups/ready`` (complete ones) and ``groups/held_rows``."""
        c = self.counts
        return {"groups/dropped": c["dropped_groups"], "groups/dropped_rows": c["dropped_rows"],
                **{f"groups/{k}": c[k] for k in self.COUNTERS[2:]},
                "groups/pending": len(self._pending), "groups/ready": len(self._ready),
                "groups/held_rows": self.held_rows()}

    def state_dict(self) -> dict:
        """JSON-able: held rows (codec bytes, base64) by group, oldest first, the keys of
        dropped groups and the counts."""
        def enc(members: list[Trajectory]) -> list[str]:
            return [base64.b64encode(codec.encode(t)).decode() for t in members]
        return {"pending": [enc(m) for m in self._pending.values()],
                "ready": [enc(m) for m in self._ready],
                "dead": [list(k) for k in self._dead], **self.counts}

    def load_state_dict(self, state: dict) -> None:
        """Restores ``state_dict()`` output (older states without the newer counts too).
        Raises ValueError on a group of more than ``group_size`` rows, a ready group of
        another size, or rows of different groups together (and ``codec.CodecError``
        on bad bytes)."""
        def dec(members: list[str]) -> list[Trajectory]:
            trajs = [codec.decode(base64.b64decode(b)) for b in members]
            if not trajs or len(trajs) > self.group_size or len({self.key(t) for t in trajs}) != 1:
                raise ValueError(f"a saved group must hold 1..{self.group_size} rows of one group")
            return trajs
        pending = [dec(m) for m in state.get("pending", [])]
        ready = [dec(m) for m in state.get("ready", [])]
        if any(len(g) != self.group_size for g in ready):
            raise ValueError(f"a ready group must hold {self.group_size} rows")
        self._pending = collections.OrderedDict((self.key(g[0]), g) for g in pending)
        self._ready = collections.deque(ready)
        self._dead = collections.OrderedDict(
            ((str(k[0]), int(k[1]), int(k[2])), None) for k in state.get("dead", []))
        self.counts = {k: int(state.get(k, 0)) for k in self.COUNTERS}


def batch_metrics(trajs: Sequence[Trajectory], learner_version: int) -> dict[str, Any]:
    """Outcome statistics of one batch: reward, tool use, lengths, staleness histogram of action tokens."""
    rewards = np.array([t.reward for t in trajs], np.float64)
    tools = np.array([metadata_number(t.metadata, "num_tool_calls") > 0 for t in trajs], np.float64)
    lags = np.concatenate([learner_version - t.policy_version[t.action_mask] for t in trajs])
    return {"rollout/reward": rewards.mean(), "rollout/tool_use": tools.mean(),
            # Tool calls that hit their wall-clock limit, per episode: a rise flags a loaded
            # or paused worker machine (its observations then say "[timed out]").
            "rollout/tool_timeouts": float(np.mean([metadata_number(t.metadata, "tool_timeouts")
                                                    for t in trajs])),
            "rollout/length": float(np.mean([t.length for t in trajs])),
            "rollout/truncated": float(np.mean([t.finish == "length" for t in trajs])),
            "batch/staleness_counts": np.bincount(np.maximum(lags, 0)).tolist()}


def train(learner, states, source: TrajectorySource, *, loop: LoopConfig, start_step: int,
          hooks: LoopHooks, timer: timing.Stopwatch | None = None):
    """Runs learner steps ``start_step .. loop.steps - 1``; returns ``(states, steps_done, counts)``.

    Args:
      learner: ``sao.learner.Learner`` (its config gives B, buckets, pad id).
      states: ``LearnerStates`` (donated step by step).
      source: the fleet (or a replay): weights are pushed to it, its snapshot
        becomes the ``fleet/...`` metrics; batches come from it unless
        ``hooks.next_batch`` is set.
      loop: the schedule; hooks: see :class:`LoopHooks`.
      timer: gets the wall seconds of each part of the steps (``sao.timing.RL_PARTS``):
        ``wait_fleet`` (the next batch), ``batch`` (padding, batch metrics,
        given advantages), ``update`` (``learner.update``, which fetches its
        metrics, so the device work is done), ``publish`` (publish + push),
        ``eval``, ``checkpoint``, ``log`` (fleet snapshot, records, progress).
        Each step's record also holds its parts up to the record's writing as
        ``time/<part>_s`` (wall) and ``time/<part>_cpu_s`` (this process's CPU),
        and the wall sum as ``time/step_s``.
    ``counts`` = ``{"trajectories": used, "dropped": dropped by the fleet}``.
    Raises TimeoutError when no batch arrives within ``loop.batch_timeout_s``.
    """
    cfg = learner.cfg
    next_batch = hooks.next_batch or source.get_batch
    timer = timing.Stopwatch() if timer is None else timer
    used, done, pushed = 0, start_step, states.policy_version
    for step in range(start_step, loop.steps):
        lap = timing.Stopwatch()
        with lap.part("wait_fleet"):
            trajs = next_batch(loop.batch_timeout_s)                     # completion order
        if not trajs:
            timer.merge(lap)
            break                                                      # prompts exhausted
        with lap.part("batch"):
            batch = make_train_batch(trajs, buckets=cfg.length_buckets, batch_size=cfg.batch_size,
                                     pad_id=cfg.pad_id)
            metrics = {**batch_metrics(trajs, states.policy_version), **hooks.batch_metrics(trajs)}
            given = None if hooks.advantages is None else hooks.advantages(trajs, cfg.batch_size)
        with lap.part("update"):
            if given is None:
                states, m = learner.update(states, batch)                # critic K steps, DIS actor step
            else:                                                      # critic-free, caller's baseline
                states, m = learner.update(states, batch, given)
        metrics.update(m)
        # The servers' log-prob parity checks of the weights that sampled this batch (the
        # start-up checks in the first record), taken before this step's push checks anew.
        metrics.update({f"parity/{k}": v for k, v in
                        _scalars(source.snapshot().get("parity", {})).items()})
        used += len(trajs)
        version = states.policy_version
        if version != pushed and version % loop.push_every == 0:
            with lap.part("publish"):                                  # fleet continues on new weights
                source.push_weights(version, hooks.publish(states, version))
            pushed = version
        with lap.part("log"):
            snap = source.snapshot()
        metrics.update({f"fleet/{k}": v for k, v in _scalars(snap).items()})
        metrics.update({f"fleet/drops/{k}": v for k, v in _scalars(snap.get("drops", {})).items()})
        since = step + 1 - loop.eval_offset
        if loop.eval_every and since > 0 and since % loop.eval_every == 0 and step + 1 < loop.steps:
            with lap.part("eval"):
                metrics.update(hooks.evaluate(states, step + 1))
        checkpoint_due = loop.checkpoint_every and (step + 1) % loop.checkpoint_every == 0
        if checkpoint_due:
            # The step's record goes out before its checkpoint: a run killed while saving
            # redoes the step on resume (records merge by step), one killed after it has
            # the record. The checkpoint's own timing follows as a second record.
            with lap.part("log"):
                hooks.write(step + 1, {**metrics, **_lap_times(lap)})
            with lap.part("checkpoint"):
                hooks.checkpoint(states, step + 1)
        metrics.update(_lap_times(lap))
        with lap.part("log"):
            hooks.write(step + 1, _lap_times(lap) if checkpoint_due else metrics)
            hooks.on_step(step + 1, metrics)
        timer.merge(lap)
        done = step + 1
    dropped = int(source.snapshot().get("dropped", 0))
    return states, done, {"trajectories": used, "dropped": dropped}


def _lap_times(lap: timing.Stopwatch) -> dict[str, float]:
    """``time/<part>_s``, ``time/<part>_cpu_s`` and ``time/step_s`` of one step so far."""
    return {**{f"time/{k}_s": v for k, v in lap.totals.items()},
            **{f"time/{k}_cpu_s": v for k, v in lap.cpu.items()},
            "time/step_s": sum(lap.totals.values())}


def _scalars(d: dict) -> dict[str, float]:
    return {k: float(v) for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
