"""A multi-turn environment with a sandboxed Python tool and a graded answer.

An episode: the policy sees the question, may call the Python tool (each call
runs a fresh sandboxed program, sao/envs/sandbox.py) and ends by giving an
answer, which the prompt's task grades. Reward = correctness in [0, 1]
(subclasses, e.g. the online drift env, reshape it via ``reward_for``).
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Mapping

from sao.envs import tools
from sao.envs.base import Env, StepResult, Task, check_prompt
from sao.envs.latency import FAILURE_TEXT, ToolLatency
from sao.envs.sandbox import SandboxLimits, ToolResult, run_python, run_python_async


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
    """Limits and format of one episode.

    Attributes:
      tool_format: ``"tags"`` (byte-level models) or ``"hermes"`` (chat models).
      max_turns: policy turns before the episode ends unanswered (reward 0).
      max_tool_calls: tool calls allowed; a further call ends the episode.
      tool_timeout_s: wall-clock seconds per tool call.
      tool_memory_mb: address-space MiB per tool call.
      max_observation_chars: tool output shown to the policy, characters.
      system_prompt: extra system text for ``"hermes"`` (after the tool list).
      latency: ``sao.envs.latency.ToolLatency``: wall-clock sleep and transient
        failures per tool call (default: none).

    Raises ValueError on a non-positive limit or unknown format.
    """

    tool_format: str = "tags"
    max_turns: int = 4
    max_tool_calls: int = 3
    tool_timeout_s: float = 5.0
    tool_memory_mb: int = 512
    max_observation_chars: int = 1000
    system_prompt: str = ""
    latency: ToolLatency = ToolLatency()

    def __post_init__(self):
        tools.check_format(self.tool_format)
        for name in ("max_turns", "tool_timeout_s", "tool_memory_mb", "max_observation_chars"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EpisodeConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.max_tool_calls < 0:
            raise ValueError(f"EpisodeConfig.max_tool_calls must be >= 0, got {self.max_tool_calls}")

    @property
    def sandbox_limits(self) -> SandboxLimits:
        return SandboxLimits(timeout_s=self.tool_timeout_s, memory_mb=self.tool_memory_mb)


class ToolEnv(Env):
    """Question -> (tool calls)* -> graded answer.

    Args:
      tasks: one ``Task`` or ``{task name: Task}``; a prompt is graded by the
        task named in ``prompt["task"]``.
      config: ``EpisodeConfig``.

    ``info`` of every step is cumulative: ``task``, ``turns``, ``tool_calls``,
    ``tool_errors`` (non-zero exit, timeout, malformed call, injected failure),
    ``tool_timeouts``, ``tool_s``, with a latency model ``tool_latency_s`` (seconds slept)
    and ``tool_failures`` (injected failures), and, once answered, ``answer`` (first 200 chars), ``correct``;
    ``end`` says why the episode ended (``answer``, ``no_answer``,
    ``max_turns``, ``max_tool_calls``).
    """

    def __init__(self, tasks: Task | Mapping[str, Task], config: EpisodeConfig | None = None):
        self.tasks = {tasks.name: tasks} if isinstance(tasks, Task) else dict(tasks)
        if not self.tasks:
            raise ValueError("ToolEnv needs at least one task")
        self.config = config or EpisodeConfig()
        self._prompt: Mapping[str, Any] | None = None
        self._info: dict[str, Any] = {}
        self._draws = None

    # -- episode -----------------------------------------------------------
    def reset(self, prompt: Mapping[str, Any]) -> str:
        prompt = check_prompt(prompt)
        task = self._task(prompt)
        self._prompt = prompt
        self._info = {"task": task.name, "turns": 0, "tool_calls": 0, "tool_errors": 0,
                      "tool_timeouts": 0, "tool_s": 0.0}
        self._draws = None
        if self.config.latency.enabled:
            self._draws = self.config.latency.episode(prompt["prompt_id"])
            self._info.update(tool_latency_s=0.0, tool_failures=0)
        question = "\n".join(p for p in (prompt["text"], task.instructions(),
                                          tools.tool_instructions(self.config.tool_format)) if p)
        if self.config.tool_format == "tags":
            return question + "\n"
        system = tools.hermes_system_prompt()
        if self.config.system_prompt:
            system = self.config.system_prompt + "\n\n" + system
        return (f"<|im_start|>system\n{system}<|im_end|>\n"
                f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")

    def step(self, action_text: str) -> StepResult:
        """Blocking step (for callers without an event loop; the agent loop uses ``astep``)."""
        pending = self._begin(action_text)
        if isinstance(pending, StepResult):
            return pending
        delay, failed = self._draw()
        time.sleep(delay)
        if failed:
            return self._failed()
        return self._tool_done(run_python(pending, limits=self.config.sandbox_limits))

    async def astep(self, action_text: str) -> StepResult:
        """``step`` for asyncio callers: grading and the tool run off the event loop."""
        pending = await asyncio.to_thread(self._begin, action_text)
        if isinstance(pending, StepResult):
            return pending
        delay, failed = self._draw()
        await asyncio.sleep(delay)            # a straggling tool: wall-clock, no CPU
        if failed:
            return self._failed()
        return self._tool_done(await run_python_async(pending, limits=self.config.sandbox_limits))

    # -- hooks -------------------------------------------------------------
    def reward_for(self, correct: float, answer: str, action_text: str) -> float:
        """Reward of a final answer; default: its correctness."""
        del answer, action_text
        return correct

    # -- internals ---------------------------------------------------------
    def _task(self, prompt: Mapping[str, Any]) -> Task:
        if prompt["task"] not in self.tasks:
            raise ValueError(f"prompt {prompt['prompt_id']!r} is for task {prompt['task']!r}; "
                             f"this env grades {sorted(self.tasks)}")
        return self.tasks[prompt["task"]]

    def _end(self, reason: str, reward: float = 0.0) -> StepResult:
        self._info["end"] = reason
        return StepResult(None, True, float(reward), dict(self._info))

    def _begin(self, action_text: str) -> StepResult | str:
        """Parses a turn: returns the final StepResult, or the code to run."""
        if self._prompt is None:
            raise RuntimeError("step() called before reset()")
        if not isinstance(action_text, str):
            raise TypeError(f"action_text must be str, got {type(action_text).__name__}")
        cfg, info = self.config, self._info
        info["turns"] += 1
        parsed = tools.parse_turn(action_text, cfg.tool_format)
        if parsed.answer is not None:
            task = self._task(self._prompt)
            correct = float(task.grade(parsed.answer, self._prompt["entry"]))
            info.update(answer=parsed.answer[:200], correct=correct)
            return self._end("answer", self.reward_for(correct, parsed.answer, action_text))
        if parsed.code is None and parsed.error is None:
            return self._end("no_answer")
        if info["tool_calls"] >= cfg.max_tool_calls:
            return self._end("max_tool_calls")
        info["tool_calls"] += 1
        if parsed.error is not None:
            info["tool_errors"] += 1
            return self._observe(tools.sanitize("[tool error] " + parsed.error))
        return parsed.code

    def _draw(self) -> tuple[float, bool]:
        """The latency model's (sleep seconds, failed) for this call; (0, False) when off."""
        if self._draws is None:
            return 0.0, False
        delay, failed = self._draws.next_call()
        self._info["tool_latency_s"] += delay
        return delay, failed

    def _failed(self) -> StepResult:
        self._info["tool_failures"] += 1
        self._info["tool_errors"] += 1
        return self._observe(FAILURE_TEXT)

    def _tool_done(self, result: ToolResult) -> StepResult:
        info = self._info
        info["tool_s"] += result.duration_s
        info["tool_timeouts"] += int(result.timed_out)
        info["tool_errors"] += int(not result.ok)
        return self._observe(tools.render_tool_result(
            result, max_chars=self.config.max_observation_chars))

    def _observe(self, text: str) -> StepResult:
        if self._info["turns"] >= self.config.max_turns:
            return self._end("max_turns")
        return StepResult(text, False, 0.0, dict(self._info))
