"""The learner loop (the paper's algorithm box), and in-process held-out evaluation.

    repeat for step = start .. steps - 1:
        collect B trajectories from the fleet, in completion order      (staleness ≤ τ, drops counted)
        SAO update: critic values → skip-observation GAE → K critic steps → DIS actor step
        publish the new policy version and push it to every rollout worker
        every eval.every steps: held-out pass@1; every checkpoint.every steps: orbax checkpoint

Everything else (building the learner, the fleet, resuming) is ``sao.run``.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from sao.learner import make_train_batch
from sao.types import Trajectory


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


class GroupedSource:
    """GRPO baselines: serves batches of whole groups (``group_size`` rollouts of one prompt).

    The prompt stream issues each prompt ``group_size`` times with ids
    ``<prompt id>#g<j>``; trajectories are held until their group is complete,
    then served ``batch_size // group_size`` groups at a time with the ``#g``
    suffix removed, so ``make_train_batch`` gives a group one ``group_ids``
    value. A group that lost a member (dropped as stale) never completes and is
    discarded after ``max_pending`` newer groups complete.
    """

    def __init__(self, source: TrajectorySource, *, group_size: int, batch_size: int,
                 max_pending: int = 1024):
        if group_size < 2 or batch_size % group_size:
            raise ValueError(f"group_size {group_size} must be >= 2 and divide batch_size {batch_size}")
        self.source, self.group_size, self.groups_per_batch = source, group_size, batch_size // group_size
        self.max_pending = max_pending
        self._pending: collections.OrderedDict[str, list] = collections.OrderedDict()
        self._ready: collections.deque[list] = collections.deque()

    def get_batch(self, timeout: float | None = None) -> list[Trajectory]:
        while len(self._ready) < self.groups_per_batch:
            trajs = self.source.get_batch(timeout=timeout)
            if not trajs:
                return []
            for t in trajs:
                group = t.prompt_id.rsplit("#g", 1)[0]
                members = self._pending.setdefault(group, [])
                members.append(dataclasses.replace(t, prompt_id=group))
                if len(members) == self.group_size:
                    self._ready.append(self._pending.pop(group))
            while len(self._pending) > self.max_pending:
                self._pending.popitem(last=False)
        return [t for _ in range(self.groups_per_batch) for t in self._ready.popleft()]

    def push_weights(self, version: int, uri: str, timeout: float | None = None) -> dict:
        return self.source.push_weights(version, uri, timeout)

    def snapshot(self) -> dict:
        return self.source.snapshot()


def batch_metrics(trajs: Sequence[Trajectory], learner_version: int) -> dict[str, Any]:
    """Outcome statistics of one batch: reward, tool use, lengths, staleness histogram of action tokens."""
    rewards = np.array([t.reward for t in trajs], np.float64)
    tools = np.array([t.metadata.get("num_tool_calls", 0) > 0 for t in trajs], np.float64)
    lags = np.concatenate([learner_version - t.policy_version[t.action_mask] for t in trajs])
    return {"rollout/reward": rewards.mean(), "rollout/tool_use": tools.mean(),
            "rollout/length": float(np.mean([t.length for t in trajs])),
            "rollout/truncated": float(np.mean([t.finish == "length" for t in trajs])),
            "batch/staleness_counts": np.bincount(np.maximum(lags, 0)).tolist()}


def train(learner, states, source: TrajectorySource, *, loop: LoopConfig, start_step: int,
          publish: Callable[[Any, int], str], evaluate: Callable[[Any, int], dict],
          checkpoint: Callable[[Any, int], None], write: Callable[[int, dict], None],
          on_step: Callable[[int, dict], None] = lambda step, m: None,
          advantages: Callable[[Sequence[Trajectory], int], np.ndarray] | None = None):
    """Runs learner steps ``start_step .. loop.steps - 1``; returns ``(states, steps_done, counts)``.

    Args:
      learner: ``sao.learner.Learner`` (its config gives B, buckets, pad id).
      states: ``LearnerStates`` (donated step by step).
      source: the fleet (or a replay).
      publish: ``publish(states, version) -> uri`` of a params checkpoint.
      evaluate: ``evaluate(states, step) -> {"eval/...": ...}``.
      checkpoint: ``checkpoint(states, step)`` saves a training checkpoint.
      write: ``write(step, metrics)``, one record per step.
      advantages: ``advantages(trajs, B) -> f32[B]`` per-row advantages for
        ``advantage_estimator="given"`` (e.g. ``sao.learner.baselines.RunningMeanBaseline``).
    ``counts`` = ``{"trajectories": used, "dropped": dropped by the fleet}``.
    Raises TimeoutError when no batch arrives within ``loop.batch_timeout_s``.
    """
    cfg = learner.cfg
    used, step, pushed = 0, start_step, states.policy_version
    for step in range(start_step, loop.steps):
        trajs = source.get_batch(timeout=loop.batch_timeout_s)          # completion order
        if not trajs:
            break                                                      # prompts exhausted
        version = states.policy_version
        batch = make_train_batch(trajs, buckets=cfg.length_buckets, batch_size=cfg.batch_size,
                                 pad_id=cfg.pad_id)
        metrics = batch_metrics(trajs, version)
        if advantages is None:
            states, m = learner.update(states, batch)                    # critic K steps, DIS actor step
        else:                                                          # critic-free, caller's baseline
            states, m = learner.update(states, batch, advantages(trajs, cfg.batch_size))
        metrics.update(m)
        used += len(trajs)
        version = states.policy_version
        if version != pushed and version % loop.push_every == 0:
            source.push_weights(version, publish(states, version))      # fleet continues on new weights
            pushed = version
        snap = source.snapshot()
        metrics.update({f"fleet/{k}": v for k, v in _scalars(snap).items()})
        metrics.update({f"fleet/drops/{k}": v for k, v in _scalars(snap.get("drops", {})).items()})
        if loop.eval_every and (step + 1) % loop.eval_every == 0 and step + 1 < loop.steps:
            metrics.update(evaluate(states, step + 1))
        if loop.checkpoint_every and (step + 1) % loop.checkpoint_every == 0:
            checkpoint(states, step + 1)
        write(step + 1, metrics)
        on_step(step + 1, metrics)
    else:
        step = loop.steps - 1
    dropped = int(source.snapshot().get("dropped", 0))
    return states, step + 1, {"trajectories": used, "dropped": dropped}


def _scalars(d: dict) -> dict[str, float]:
    return {k: float(v) for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def sample_episodes(engine, make_env, tokenizer, prompts: Sequence[dict], sampling, *,
                    concurrency: int, max_turns: int, max_total_tokens: int) -> list[Trajectory]:
    """One episode per prompt on an in-process engine (evaluation, value pretraining data)."""
    from sao.rollout.agent import run_episodes
    return asyncio.run(run_episodes(engine, make_env, tokenizer, list(prompts), sampling,
                                    concurrency=concurrency, max_turns=max_turns,
                                    max_total_tokens=max_total_tokens))


def pass_at_1(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Held-out metrics: pass@1 (one sample per prompt, reward 1 = solved), tool-use rate, length."""
    if not trajs:
        raise ValueError("no evaluation trajectories")
    return {"eval/accuracy": float(np.mean([t.reward >= 1.0 for t in trajs])),
            "eval/reward": float(np.mean([t.reward for t in trajs])),
            "eval/tool_use": float(np.mean([t.metadata.get("num_tool_calls", 0) > 0 for t in trajs])),
            "eval/length": float(np.mean([t.length for t in trajs])),
            "eval/prompts": float(len(trajs))}
