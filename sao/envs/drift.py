"""Simulated online learning: the rewarded answer style drifts with learner steps.

docs/algorithm.md §8: the preferred behaviour switches during training (paper: at
~step 150 and ~step 300); reward = quality x style, both binary, from a judge.
Here the behaviour is the *style* of the final answer (``STYLES`` in
sao/envs/judges.py: ``bare`` "42", ``sentence`` "The answer is 42.",
``boxed`` "\\boxed{42}") on numeric-answer tasks (reasoning-gym arithmetic).
The prompt does not say which style is wanted: the policy must find out from
rewards, and re-adapt after each switch. ``adaptation_lag`` measures how many
learner steps that takes.

**[ours]** The style in force is the one at the learner step when the answer
is judged (read from ``clock``), not when the episode started.
"""
from __future__ import annotations

import bisect
import dataclasses
import threading
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from sao.envs.base import Task
from sao.envs.judges import Judge, RuleJudge, check_style
from sao.envs.tool_env import EpisodeConfig, ToolEnv


STYLE_CYCLE: tuple[str, ...] = ("bare", "sentence", "boxed")


@dataclasses.dataclass(frozen=True)
class DriftSchedule:
    """Which style is rewarded at each learner step.

    Attributes:
      styles: style of each phase; phase i holds from ``switch_steps[i-1]``
        (0 for i = 0) up to ``switch_steps[i]``.
      switch_steps: strictly increasing learner steps (> 0) at which the next
        phase starts; ``len(styles) == len(switch_steps) + 1``.

    Raises ValueError on an unknown style, a bad ordering or a length mismatch.
    """

    styles: tuple[str, ...] = ("bare", "sentence", "boxed")
    switch_steps: tuple[int, ...] = (150, 300)

    def __post_init__(self):
        object.__setattr__(self, "styles", tuple(self.styles))
        object.__setattr__(self, "switch_steps", tuple(int(s) for s in self.switch_steps))
        for s in self.styles:
            check_style(s)
        if len(self.styles) != len(self.switch_steps) + 1:
            raise ValueError(f"{len(self.styles)} styles need {len(self.styles) - 1} switch steps, "
                             f"got {len(self.switch_steps)}")
        steps = (0,) + self.switch_steps
        if any(b <= a for a, b in zip(steps, steps[1:])):
            raise ValueError(f"switch_steps must be positive and increasing: {self.switch_steps}")

    def phase(self, step: int) -> int:
        """Index of the phase in force at learner ``step`` (>= 0)."""
        if step < 0:
            raise ValueError(f"learner step must be >= 0, got {step}")
        return int(np.searchsorted(np.asarray(self.switch_steps), step, side="right"))

    def style(self, step: int) -> str:
        return self.styles[self.phase(step)]

    @classmethod
    def cycling(cls, switch_steps: Sequence[int],
                styles: Sequence[str] = STYLE_CYCLE) -> "DriftSchedule":
        """A schedule switching at ``switch_steps`` through ``styles`` in turn
        (``(150, 300)`` -> bare, sentence, boxed)."""
        n = len(switch_steps) + 1
        return cls(tuple(styles[i % len(styles)] for i in range(n)), tuple(switch_steps))


class LearnerClock:
    """The learner step as the rollout worker knows it (thread-safe).

    The worker calls ``set(version)`` when it loads new weights; drift envs
    read it when judging. Callable: ``clock() -> int``.
    """

    def __init__(self, step: int = 0):
        self._step = int(step)
        self._lock = threading.Lock()

    def set(self, step: int) -> None:
        with self._lock:
            self._step = int(step)

    def __call__(self) -> int:
        with self._lock:
            return self._step


class DriftEnv(ToolEnv):
    """``ToolEnv`` whose reward is quality x style under a ``DriftSchedule``.

    Args:
      tasks: one numeric-answer ``Task`` or ``{name: Task}`` (graders judge quality).
      schedule: the style schedule.
      clock: returns the current learner step (e.g. a ``LearnerClock``, or
        ``lambda: engine.version``).
      judge: one judge for every task; default a ``RuleJudge`` per task. An
        ``OpenAIJudge`` raises ``JudgeError`` when it fails, which the agent
        loop records as ``finish="error"``.
      config: ``EpisodeConfig`` (the tool stays available).

    ``info`` adds ``learner_step``, ``phase``, ``required_style``, ``quality``
    and ``style_ok`` to ToolEnv's; ``correct`` is the judge's quality.
    """

    def __init__(self, tasks: Task | Mapping[str, Task], schedule: DriftSchedule,
                 clock: Callable[[], int], *, judge: Judge | None = None,
                 config: EpisodeConfig | None = None):
        super().__init__(tasks, config)
        self.schedule, self.clock = schedule, clock
        self.judges = {name: judge or RuleJudge(task) for name, task in self.tasks.items()}

    def reward_for(self, correct: float, answer: str, action_text: str) -> float:
        del correct, action_text
        step = int(self.clock())
        style = self.schedule.style(step)
        prompt = self._prompt
        verdict = self.judges[prompt["task"]].judge(prompt["text"], answer, prompt["entry"], style)
        self._info.update(learner_step=step, phase=self.schedule.phase(step),
                          required_style=style, quality=verdict.quality,
                          style_ok=verdict.style, correct=verdict.quality)
        return verdict.quality * verdict.style


def adaptation_lag(steps: Sequence[int], rewards: Sequence[float],
                   switch_steps: Sequence[int], *, level: float,
                   window: int = 1) -> list[int | None]:
    """Learner steps needed after each switch to recover a reward level.

    For switch ``s`` the lag is ``t - s`` for the first logged step ``t >= s``
    (before the next switch) at which the mean reward of the last ``window``
    logged points since ``s`` is ``>= level``; None if that never happens.

    Args:
      steps: i64[N] learner steps of the log, strictly increasing.
      rewards: f32[N] mean episode reward at each logged step.
      switch_steps: learner steps at which the rewarded behaviour switched.
      level: reward level that counts as recovered.
      window: moving-average length in logged points (>= 1).

    Raises ValueError on mismatched lengths, unsorted steps or window < 1.
    """
    steps_a = np.asarray(steps, dtype=np.int64)
    rewards_a = np.asarray(rewards, dtype=np.float64)
    if steps_a.shape != rewards_a.shape or steps_a.ndim != 1:
        raise ValueError(f"steps and rewards must be 1-D of one length, got "
                         f"{steps_a.shape} and {rewards_a.shape}")
    if np.any(np.diff(steps_a) <= 0):
        raise ValueError("steps must be strictly increasing")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    bounds = list(switch_steps) + [np.iinfo(np.int64).max]
    lags: list[int | None] = []
    for s, end in zip(bounds[:-1], bounds[1:]):
        seg = (steps_a >= s) & (steps_a < end)
        seg_steps, seg_rewards = steps_a[seg], rewards_a[seg]
        lag = None
        for i in range(len(seg_steps)):
            lo = max(0, i - window + 1)
            if i - lo + 1 == window and seg_rewards[lo:i + 1].mean() >= level:
                lag = int(seg_steps[i] - s)
                break
        lags.append(lag)
    return lags


def phase_rewards(info_log: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """Mean reward (quality x style) per phase from a list of episode infos."""
    by_phase: dict[int, list[float]] = {}
    for info in info_log:
        if "phase" in info:
            by_phase.setdefault(int(info["phase"]), []).append(
                float(info["quality"]) * float(info["style_ok"]))
    return {p: float(np.mean(v)) for p, v in sorted(by_phase.items())}


def drift_summary(records: Sequence[Mapping[str, Any]], switch_steps: Sequence[int], *,
                  recovery_fraction: float = 0.9, window: int = 3) -> dict[str, Any]:
    """Adaptation after each style switch, from a run's per-step metrics.

    The clock is the policy version the judged episodes were sampled at
    (``env/learner_step``, the drift env's own clock); steps that trained on
    several batches of one version are averaged. For switch ``s`` the level
    to recover is ``recovery_fraction`` times the mean ``rollout/reward`` of
    the last ``window`` versions before ``s``, and the lag is
    :func:`adaptation_lag` at that level (None: not recovered before the next
    switch or the end of the run). A switch with no reward logged before it,
    or a mean reward of 0 there, has nothing to recover: level and lag None
    (a level of 0 would count any reward, even 0, as recovered).

    Args:
      records: per-step metric dicts of the RL phase (``sao.run_metrics.read_metrics``).
      switch_steps: the schedule's switch versions (``env.drift_schedule``).
      recovery_fraction: fraction of the pre-switch reward that counts as recovered.
      window: versions averaged before a switch and by ``adaptation_lag``.

    Returns:
      ``{"switch_steps", "levels", "adaptation_lag", "phase_reward"}`` where
      ``phase_reward`` is the mean reward per phase index (JSON-able).
    """
    by_version: dict[int, list[float]] = {}
    for rec in records:
        if "env/learner_step" in rec and "rollout/reward" in rec:
            by_version.setdefault(int(rec["env/learner_step"]), []).append(
                float(rec["rollout/reward"]))
    versions = sorted(by_version)
    rewards = [float(np.mean(by_version[v])) for v in versions]
    switches = [int(s) for s in switch_steps]
    levels: list[float | None] = []
    lags: list[int | None] = []
    for i, s in enumerate(switches):
        before = [r for v, r in zip(versions, rewards) if v < s][-window:]
        # nothing to recover when no reward was logged before the switch, or it was 0
        level = (recovery_fraction * float(np.mean(before))
                 if before and float(np.mean(before)) > 0 else None)
        levels.append(level)
        lags.append(None if level is None else adaptation_lag(
            versions, rewards, switches, level=level, window=window)[i])
    phases: dict[int, list[float]] = {}
    for v, r in zip(versions, rewards):
        phases.setdefault(bisect.bisect_right(switches, v), []).append(r)
    return {"switch_steps": switches, "levels": levels, "adaptation_lag": lags,
            "phase_reward": {str(p): float(np.mean(v)) for p, v in sorted(phases.items())}}
