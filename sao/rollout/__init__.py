"""Rollout: the ``Engine`` interface, its backends and the agent loop.

``JaxEngine`` (needs JAX + ``sao.models``) and ``SGLangEngine`` / ``SGLangServer``
(need aiohttp) are imported on first use so that light users (the learner,
tests of the agent loop) do not pay for them.
"""
from sao.rollout.agent import (TurnFormat, byte_tool_format, chatml_tool_format, run_episode,
                               run_episodes)
from sao.rollout.base import (Completion, Engine, EngineError, SamplingParams)
from sao.rollout.scripted import ScriptedEngine, ScriptedTurn
from sao.rollout.show import format_trajectory

_LAZY = {
    "JaxEngine": "sao.rollout.jax_engine",
    "SGLangEngine": "sao.rollout.sglang_engine",
    "SGLangServer": "sao.rollout.sglang_server",
}

__all__ = ["Completion", "Engine", "EngineError", "SamplingParams", "ScriptedEngine",
           "ScriptedTurn", "TurnFormat", "byte_tool_format", "chatml_tool_format",
           "format_trajectory", "run_episode", "run_episodes", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sao.rollout' has no attribute {name!r}")
