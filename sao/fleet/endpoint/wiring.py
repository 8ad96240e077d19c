"""The worker's harness episode function, built from an experiment config.

``env.harness`` picks who drives an episode: ``""`` the native agent loop
(sao/rollout/agent.py, not this package), ``"mini-swe-agent"`` the
unmodified mini-swe-agent (sao/fleet/endpoint/mswea.py) on a sandboxed
workspace of the prompt's repository task (sao/envs/swe), or
``"reference"`` our reference harness (sao/fleet/endpoint/reference.py)
stepping the config's own environment (``SweEnv`` for ``swe/`` tasks). Both
call the worker's endpoint, which starts on the worker's event loop with the
first episode and serves only the run's token.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping

from sao.fleet.endpoint.episode import harness_episode_fn
from sao.fleet.endpoint.server import Endpoint, EndpointConfig

HARNESSES = ("", "mini-swe-agent", "reference")


def check_harness(name: str) -> str:
    if name not in HARNESSES:
        raise ValueError(f"env.harness must be one of {HARNESSES}, got {name!r}")
    return name


def _is_swe(tasks: Mapping[str, Any]) -> bool:
    return any(name.startswith("swe/") for name in tasks)


def reference_harness(cfg, tasks: Mapping[str, Any], make_env: Callable[[], Any]):
    """``ReferenceHarness`` over ``make_env`` with the tools and the first user
    message the env's own prompt holds (so the endpoint renders the same ids):
    with ``env.prompt_style="question"`` the question alone, as
    ``components.make_env_factory`` gives the native loop in the byte
    ``"tags"`` format (``sao.config_checks`` refuses "question" for swe/
    tasks, whose demonstrations show the tool instructions, and for the
    ``"hermes"`` format, whose dialect lists the tools in a system turn)."""
    from sao.envs import tools as py_tools
    from sao.fleet.endpoint.reference import ReferenceHarness
    fmt = cfg.env.tool_format
    question_only = cfg.env.get("prompt_style", "env") == "question"
    if _is_swe(tasks):
        from sao.envs.swe import actions
        schemas = actions.TOOL_SCHEMAS

        def parts(prompt):
            return [prompt["text"], actions.tool_instructions(fmt)]
    else:
        schemas = [py_tools.PYTHON_TOOL_SCHEMA]

        def parts(prompt):
            return [prompt["text"], tasks[prompt["task"]].instructions(),
                    py_tools.tool_instructions(fmt)]

    def messages_for(prompt):
        content = prompt["text"] if question_only else "\n".join(p for p in parts(prompt) if p)
        return [{"role": "user", "content": content}]
    return ReferenceHarness(make_env, messages_for, schemas, fmt=fmt,
                            max_calls=cfg.rollout.max_turns + 1)


def mini_swe_agent_harness(cfg, tasks: Mapping[str, Any]):
    """mini-swe-agent on a ``Workspace`` of the prompt's task; graded by its tests."""
    if not _is_swe(tasks):
        raise ValueError("env.harness='mini-swe-agent' needs swe/ tasks (a repository to work in)")
    from sao.envs.swe import ExecLimits, Workspace, grade_files, start_files
    from sao.fleet.endpoint.mswea import MiniSweAgentHarness
    e = cfg.env
    limits = ExecLimits(timeout_s=e.tool_timeout_s, memory_mb=max(e.tool_memory_mb, 1024),
                        max_output_bytes=max(4096, 4 * e.max_observation_chars))

    def make_workspace(prompt):
        return Workspace(start_files(prompt["entry"]), limits)

    def grade(prompt, workspace):
        facts = grade_files(prompt["entry"], start_files(prompt["entry"]), workspace.files)
        return float(facts["correct"]), facts

    return MiniSweAgentHarness(make_workspace, grade, lambda p: p["text"],
                               step_limit=cfg.rollout.max_turns,
                               command_timeout_s=max(1, int(e.tool_timeout_s)),
                               max_threads=cfg.rollout.max_concurrency,
                               max_output_chars=e.max_observation_chars,
                               agent_kwargs={"wall_time_limit_seconds": int(e.harness_timeout_s)})


class LazyHarness:
    """Builds its harness at the first episode, in a thread: importing
    mini-swe-agent and litellm takes tens of seconds, which a worker should
    not spend before it reports ready."""

    def __init__(self, make: Callable[[], Any]):
        self._make, self._harness, self._lock = make, None, asyncio.Lock()

    async def run(self, prompt, base_url: str, api_key: str):
        if self._harness is None:
            async with self._lock:
                if self._harness is None:
                    self._harness = await asyncio.to_thread(self._make)
        return await self._harness.run(prompt, base_url, api_key)


def harness_episode(cfg, engine, tokenizer, token: str, tasks: Mapping[str, Any],
                    make_env: Callable[[], Any], sampling):
    """``async episode(prompt, temperature=None) -> Trajectory`` for a rollout
    worker with ``env.harness`` set; the endpoint (token ``token``) starts
    with the first episode. Raises ValueError for an unknown harness or
    mini-swe-agent without swe/ tasks."""
    name = check_harness(cfg.env.harness)
    if not name:
        raise ValueError("env.harness is empty: the worker runs the native agent loop")
    harness = (LazyHarness(lambda: mini_swe_agent_harness(cfg, tasks)) if name == "mini-swe-agent"
               else reference_harness(cfg, tasks, make_env))
    endpoint = Endpoint(engine, tokenizer, EndpointConfig(token=token))
    inner = harness_episode_fn(endpoint, harness, sampling, max_turns=cfg.rollout.max_turns,
                               max_total_tokens=cfg.rollout.max_len,
                               timeout_s=cfg.env.harness_timeout_s)
    lock = asyncio.Lock()

    async def episode(prompt: dict, temperature: float | None = None):
        if not endpoint.port:
            async with lock:
                if not endpoint.port:
                    await endpoint.start()
        return await inner(prompt, temperature)

    episode.endpoint = endpoint   # for tests and metrics
    return episode
