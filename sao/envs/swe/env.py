"""``SweEnv``: a repository episode with bash, a file editor and submit.

``reset(prompt)`` loads the task's starting repository (base + injected bug,
sao/envs/swe/repos.py) into a ``Workspace``; each ``step`` runs one tool call:
bash in a fresh namespace sandbox with the working copy (per-call time and
output limits, no network), the editor on the working copy, or submit. The
episode ends on submit, at ``max_turns`` or past ``max_tool_calls``; it is then
graded in a fresh sandbox with the original test files restored
(sao/envs/swe/testrun.py): reward 1.0 iff every FAIL_TO_PASS and
PASS_TO_PASS test passes, else 0.0 (an unfinished episode is graded as it
stands, as SWE-bench grades a harness's final diff).

``info`` (cumulative, ends up in the trajectory's metadata): ``task``,
``instance_id``, ``turns``, ``tool_calls``, ``tool_errors`` (malformed calls,
editor errors, failed sandbox calls; a command's non-zero exit is not one),
``tool_timeouts``, ``tool_s``, and when graded ``correct``,
``tests_passed``, ``tests_total``, ``f2p_passed``, ``f2p_total``,
``patch_lines``, ``patch_bytes``, ``test_s``, ``end`` (``submit``,
``max_turns``, ``max_tool_calls``).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Mapping

from sao.envs import tools
from sao.envs.base import Env, StepResult, Task, check_prompt
from sao.envs.swe import actions
from sao.envs.swe.editor import EditorError, run_editor
from sao.envs.swe.files import Files, unified_diff
from sao.envs.swe.repos import start_files
from sao.envs.swe.testrun import grade_files
from sao.envs.swe.workspace import ExecLimits, Workspace
from sao.envs.tool_env import EpisodeConfig


def swe_prompt(text: str, fmt: str, system_prompt: str = "") -> str:
    """The prompt of an episode: the issue and tool instructions; for
    ``"hermes"`` a ChatML system turn listing the tools, the user turn and an
    open assistant turn."""
    question = text + "\n" + actions.tool_instructions(fmt)
    if fmt == "tags":
        return question + "\n"
    system = actions.hermes_system_prompt()
    if system_prompt:
        system = system_prompt + "\n\n" + system
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")


class SweEnv(Env):
    """Issue -> (bash / editor calls)* -> submit -> tests.

    Args:
      tasks: one ``Task`` or ``{name: Task}`` whose records are SWE entries
        (sao/envs/swe/task.py); a prompt must name one of them.
      config: ``EpisodeConfig`` (``tool_format``, ``max_turns``,
        ``max_tool_calls``, ``tool_timeout_s`` per bash call,
        ``tool_memory_mb``, ``max_observation_chars``, ``system_prompt``).
      limits: workspace limits (default from ``config``: timeout, memory,
        output cap of 4x the observation size).
    """

    def __init__(self, tasks: Task | Mapping[str, Task], config: EpisodeConfig | None = None,
                 limits: ExecLimits | None = None):
        self.tasks = {tasks.name: tasks} if isinstance(tasks, Task) else dict(tasks)
        if not self.tasks:
            raise ValueError("SweEnv needs at least one task")
        self.config = config or EpisodeConfig(max_turns=20, max_tool_calls=19,
                                              tool_timeout_s=30.0, tool_memory_mb=2048)
        self.limits = limits or ExecLimits(
            timeout_s=self.config.tool_timeout_s, memory_mb=max(self.config.tool_memory_mb, 1024),
            max_output_bytes=max(4096, 4 * self.config.max_observation_chars))
        self._entry: Mapping[str, Any] | None = None
        self._start: Files = {}
        self._ws: Workspace | None = None
        self._info: dict[str, Any] = {}

    @property
    def workspace(self) -> Workspace:
        """The episode's working copy (after ``reset``)."""
        if self._ws is None:
            raise RuntimeError("reset() first")
        return self._ws

    def reset(self, prompt: Mapping[str, Any]) -> str:
        prompt = check_prompt(prompt)
        if prompt["task"] not in self.tasks:
            raise ValueError(f"prompt {prompt['prompt_id']!r} is for task {prompt['task']!r}; "
                             f"this env has {sorted(self.tasks)}")
        entry = prompt["entry"]
        if not isinstance(entry, Mapping) or "FAIL_TO_PASS" not in entry:
            raise ValueError(f"prompt {prompt['prompt_id']!r}: entry is not a SWE task entry")
        self._entry = entry
        self._start = start_files(entry)
        self._ws = Workspace(self._start, self.limits)
        self._info = {"task": prompt["task"], "instance_id": entry.get("instance_id", ""),
                      "turns": 0, "tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0,
                      "tool_s": 0.0}
        return swe_prompt(prompt["text"], self.config.tool_format, self.config.system_prompt)

    async def astep(self, action_text: str) -> StepResult:
        """``step`` off the event loop (tools and grading block)."""
        return await asyncio.to_thread(self.step, action_text)

    def step(self, action_text: str) -> StepResult:
        if self._entry is None or self._ws is None:
            raise RuntimeError("step() called before reset()")
        if not isinstance(action_text, str):
            raise TypeError(f"action_text must be str, got {type(action_text).__name__}")
        info, cfg = self._info, self.config
        info["turns"] += 1
        act = actions.parse_action(action_text, cfg.tool_format)
        if act.tool == actions.SUBMIT:
            return self._finish("submit")
        if info["tool_calls"] >= cfg.max_tool_calls:
            return self._finish("max_tool_calls")
        info["tool_calls"] += 1
        start = time.monotonic()
        if act.tool is None:
            info["tool_errors"] += 1
            text = "[tool error] " + (act.error or "no tool call; call a tool, or submit")
        elif act.tool == actions.EDITOR:
            text = self._edit(act.args)
        else:
            text = self._bash(act.args["command"])
        info["tool_s"] = round(info["tool_s"] + time.monotonic() - start, 3)
        if info["turns"] >= cfg.max_turns:
            return self._finish("max_turns")
        return StepResult(actions.clip(text, "", cfg.max_observation_chars), False, 0.0,
                          dict(info))

    def _bash(self, command: str) -> str:
        res = self._ws.run(command, timeout=self.config.tool_timeout_s)
        self._info["tool_timeouts"] += int(res.timed_out)
        self._info["tool_errors"] += int(res.error is not None and not res.timed_out)
        return actions.render_output(res.output, returncode=res.returncode,
                                     timed_out=res.timed_out, truncated=res.truncated,
                                     error=res.error, max_chars=self.config.max_observation_chars)

    def _edit(self, args: Mapping[str, Any]) -> str:
        files = self._ws.files
        try:
            text = run_editor(files, args)
        except EditorError as e:
            self._info["tool_errors"] += 1
            return "[tool error] " + str(e)
        self._ws.replace_files(files)
        return tools.sanitize(text)

    def _finish(self, reason: str) -> StepResult:
        work = self._ws.files
        facts = grade_files(self._entry, self._start, work)
        info = self._info
        info.update(facts, end=reason, patch_bytes=len(unified_diff(self._start, work)))
        return StepResult(None, True, float(facts["correct"]), dict(info))

