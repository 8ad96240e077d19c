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
      never); ``batch_timeout_s``: give up when the fleet stalls this long.
    """

    steps: int
    push_every: int = 1
    eval_every: int = 0
    checkpoint_every: int = 0
    batch_timeout_s: float | None = None


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
    """GRPO batches: whole groups (``group_size`` rollouts of one prompt in one epoch).

    ``GroupBatcher(source.get_batch, ...)`` is a ``LoopHooks.next_batch``.
    Trajectories are held until their group ``(prompt_id, epoch)`` is
    complete, then served ``batch_size // group_size`` groups at a time, so
    ``make_train_batch`` gives a group one ``group_ids`` value. A group that
    lost a member (dropped as stale) never completes and is discarded after
    ``max_pending`` newer groups start; ``metrics()`` counts such groups and
    their rows. ``state_dict`` / ``load_state_dict`` carry the held rows
    across a checkpoint (the dispatcher's state holds the rest of each group:
    buffered, in flight, or not yet issued). Raises ValueError unless
    ``group_size`` >= 2 divides ``batch_size``.
    """

    def __init__(self, get_batch: Callable[[float | None], list[Trajectory]], *, group_size: int,
                 batch_size: int, max_pending: int = 1024):
        if group_size < 2 or batch_size % group_size:
            raise ValueError(f"group_size {group_size} must be >= 2 and divide batch_size {batch_size}")
        self.get_batch, self.group_size = get_batch, group_size
        self.groups_per_batch, self.max_pending = batch_size // group_size, max_pending
        self._pending: collections.OrderedDict[tuple[str, int], list] = collections.OrderedDict()
        self._ready: collections.deque[list] = collections.deque()
        self.dropped_groups = self.dropped_rows = 0

    def __call__(self, timeout: float | None = None) -> list[Trajectory]:
        while len(self._ready) < self.groups_per_batch:
            trajs = self.get_batch(timeout)
            if not trajs:
                return []
            for t in trajs:
                key = (t.prompt_id, t.epoch)
                members = self._pending.setdefault(key, [])
                members.append(t)
                if len(members) == self.group_size:
                    self._ready.append(self._pending.pop(key))
            while len(self._pending) > self.max_pending:
                _, members = self._pending.popitem(last=False)
                self.dropped_groups += 1
                self.dropped_rows += len(members)
        return [t for _ in range(self.groups_per_batch) for t in self._ready.popleft()]

    def metrics(self) -> dict[str, int]:
        """``groups/dropped`` (discarded incomplete groups) and their rows
        ``groups/dropped_rows``, cumulative over resumes; groups held now,
        incomplete (``groups/pending``) and complete (``groups/ready``)."""
        return {"groups/dropped": self.dropped_groups, "groups/dropped_rows": self.dropped_rows,
                "groups/pending": len(self._pending), "groups/ready": len(self._ready)}

    def state_dict(self) -> dict:
        """JSON-able: held rows (codec bytes, base64) by group, oldest first, and the drop counts."""
        def enc(members: list[Trajectory]) -> list[str]:
            return [base64.b64encode(codec.encode(t)).decode() for t in members]
        return {"pending": [enc(m) for m in self._pending.values()],
                "ready": [enc(m) for m in self._ready],
                "dropped_groups": self.dropped_groups, "dropped_rows": self.dropped_rows}

    def load_state_dict(self, state: dict) -> None:
        """Restores ``state_dict()`` output. Raises ValueError on a group of
        more than ``group_size`` rows, a ready group of another size, or rows
        of different groups together (and ``codec.CodecError`` on bad bytes)."""
        def dec(members: list[str]) -> list[Trajectory]:
            trajs = [codec.decode(base64.b64decode(b)) for b in members]
            if not trajs or len(trajs) > self.group_size or len(
                    {(t.prompt_id, t.epoch) for t in trajs}) != 1:
                raise ValueError(f"a saved group must hold 1..{self.group_size} rows of one group")
            return trajs
        pending = [dec(m) for m in state.get("pending", [])]
        ready = [dec(m) for m in state.get("ready", [])]
        if any(len(g) != self.group_size for g in ready):
            raise ValueError(f"a ready group must hold {self.group_size} rows")
        self._pending = collections.OrderedDict(((g[0].prompt_id, g[0].epoch), g) for g in pending)
        self._ready = collections.deque(ready)
        self.dropped_groups = int(state.get("dropped_groups", 0))
        self.dropped_rows = int(state.get("dropped_rows", 0))


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
        if loop.eval_every and (step + 1) % loop.eval_every == 0 and step + 1 < loop.steps:
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
