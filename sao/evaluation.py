"""Sampling with the learner's current weights in-process: held-out pass@1 and value-pretraining data.

The learner keeps one ``JaxEngine`` over its own policy module; before each use
the engine loads the given train states' actor parameters. :func:`pass_at_1`
turns one sample per held-out prompt into the ``eval/...`` metrics; the
learner's phases see evaluation as ``evaluate(states, step) -> metrics`` only,
so it can move elsewhere (e.g. to the fleet) without touching them.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

import numpy as np

from sao.rollout.agent import run_episodes
from sao.types import Trajectory


def pass_at_1(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Held-out metrics: pass@1 (one sample per prompt, reward 1 = solved), tool-use rate, length.

    Raises ValueError on no trajectories.
    """
    if not trajs:
        raise ValueError("no evaluation trajectories")
    return {"eval/accuracy": float(np.mean([t.reward >= 1.0 for t in trajs])),
            "eval/reward": float(np.mean([t.reward for t in trajs])),
            "eval/tool_use": float(np.mean([t.metadata.get("num_tool_calls", 0) > 0 for t in trajs])),
            "eval/length": float(np.mean([t.length for t in trajs])),
            "eval/prompts": float(len(trajs))}


class Sampler:
    """One episode per prompt on an in-process engine, with the weights of given train states.

    Args:
      engine: a ``JaxEngine`` (the learner's policy module; version 0 at start).
      make_env: ``() -> Env``.
      tokenizer, sampling: the rollout tokenizer and ``SamplingParams``.
      param_state: ``param_state(states) -> nnx.State`` of the actor's parameters.
      concurrency: episodes at once; episode_kwargs: ``run_episodes`` keywords
        (``max_turns``, ``max_total_tokens``, ``turn_format``).
    """

    def __init__(self, engine, make_env: Callable[[], Any], tokenizer, sampling, *,
                 param_state: Callable[[Any], Any], concurrency: int, **episode_kwargs):
        self.engine, self.make_env, self.tokenizer, self.sampling = engine, make_env, tokenizer, sampling
        self.param_state, self.concurrency, self.episode_kwargs = param_state, concurrency, episode_kwargs

    def sample(self, states, prompts: Sequence[dict], temperature: float | None = None) -> list[Trajectory]:
        """Trajectories of ``prompts`` in order, at the rollout temperature unless ``temperature``."""
        sampling = self.sampling if temperature is None else self.sampling.replace(temperature=temperature)

        async def go():
            await self.engine.set_params(states.policy_version, self.param_state(states))
            return await run_episodes(self.engine, self.make_env, self.tokenizer, list(prompts),
                                      sampling, concurrency=self.concurrency, **self.episode_kwargs)
        return asyncio.run(go())

    def pass_at_1(self, states, prompts: Sequence[dict], temperature: float) -> dict[str, float]:
        """:func:`pass_at_1` of one sample per prompt at ``temperature``."""
        return pass_at_1(self.sample(states, prompts, temperature=temperature))
