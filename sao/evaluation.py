"""Sampling with the learner's current weights: held-out pass@1 and value-pretraining data.

Two samplers with one interface (``sample``, ``pass_at_1``, ``using``):

* :class:`Sampler`, in process: the learner keeps one ``JaxEngine`` over its
  own policy module; before each use the engine loads the given train
  states' actor parameters.
* :class:`FleetSampler`, on the rollout fleet, for engines the learner cannot
  hold (SGLang servers; ``eval.where``): the states are published and pushed,
  and each prompt is one sampling-job lease at the requested temperature
  (``Dispatcher.sample``): never trained on, counted apart from training.
  During RL it uses the run's dispatcher (``using``), before and after a
  short-lived one over the same workers.

:func:`pass_at_1` turns one sample per held-out prompt into the ``eval/...``
metrics; the learner's phases see evaluation as ``evaluate(states, step) ->
metrics`` only.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
from sao.rollout.agent import run_episodes
from sao.types import Trajectory, metadata_number


def pass_at_1(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Held-out metrics: pass@1 (mean over samples, reward 1 = solved), tool-use rate, length,
    and ``eval/solved_per_prompt``: solved samples per ``prompt_id`` (order of first
    appearance; what a paired comparison of two policies on the same prompts needs).

    Raises ValueError on no trajectories.
    """
    if not trajs:
        raise ValueError("no evaluation trajectories")
    solved: dict[str, int] = {}
    for t in trajs:                                  # per prompt, in order of first appearance
        solved[t.prompt_id] = solved.get(t.prompt_id, 0) + int(t.reward >= 1.0)
    return {"eval/solved_per_prompt": list(solved.values()),"eval/accuracy": float(np.mean([t.reward >= 1.0 for t in trajs])),
            "eval/reward": float(np.mean([t.reward for t in trajs])),
            "eval/tool_use": float(np.mean([metadata_number(t.metadata, "num_tool_calls") > 0
                                            for t in trajs])),
            "eval/tool_timeouts": float(np.mean([metadata_number(t.metadata, "tool_timeouts")
                                                 for t in trajs])),
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

    @contextlib.contextmanager
    def using(self, dispatcher) -> Iterator[None]:
        """Nothing to do in process (the fleet's dispatcher is for :class:`FleetSampler`)."""
        yield


class FleetSampler:
    """One episode per prompt on the rollout fleet, with the weights of given train states.

    Args:
      addresses: the workers' ``host:port``.
      config: settings of the short-lived dispatchers (security, vocabulary,
        length and reward bounds, timeouts); its ``initial_version`` is
        replaced by the states' version.
      publish: ``publish(states, version) -> uri`` (``sao.publishing.Publisher``:
        the latest version again returns its uri).
      temperature: default sampling temperature (the rollout's).
      timeout_s: most seconds one ``sample`` waits for its episodes.
    """

    def __init__(self, addresses: Sequence[str], config: DispatcherConfig,
                 publish: Callable[[Any, int], str], *, temperature: float,
                 timeout_s: float | None = None):
        self.addresses, self.config, self.publish = list(addresses), config, publish
        self.temperature, self.timeout_s = temperature, timeout_s
        self._dispatcher: Dispatcher | None = None
        self.missing = 0  # prompts without a trajectory (failed / invalid), over all calls

    @contextlib.contextmanager
    def using(self, dispatcher: Dispatcher) -> Iterator[None]:
        """Samples through ``dispatcher`` (the RL loop's) inside the block."""
        self._dispatcher = dispatcher
        try:
            yield
        finally:
            self._dispatcher = None

    def sample(self, states, prompts: Sequence[dict],
               temperature: float | None = None) -> list[Trajectory]:
        """Trajectories of ``prompts`` (prompt order; those that failed every
        attempt or validation left out and counted in ``missing``), at the
        rollout temperature unless ``temperature``. Every action token was
        sampled by the weights of ``states`` (version ``states.policy_version``).

        Raises TimeoutError after ``timeout_s``, ``FleetError`` as the dispatcher.
        """
        t = self.temperature if temperature is None else temperature
        version = int(states.policy_version)
        d = self._dispatcher
        if d is not None:  # the RL loop's: push only a version it has not pushed
            if d.learner_version != version or d.latest_weights() is None:
                d.push_weights(version, self.publish(states, version))
            results = d.sample(list(prompts), temperature=t, timeout=self.timeout_s)
        else:
            d = Dispatcher(self.addresses, (), dataclasses.replace(self.config,
                                                                  initial_version=version))
            d.push_weights(version, self.publish(states, version))  # synced as each link joins
            with d:
                results = d.sample(list(prompts), temperature=t, timeout=self.timeout_s)
        self.missing += sum(r is None for r in results)
        return [r for r in results if r is not None]

    def pass_at_1(self, states, prompts: Sequence[dict], temperature: float) -> dict[str, float]:
        """:func:`pass_at_1` of one sample per prompt at ``temperature`` (a prompt
        without a trajectory counts as unsolved; ``eval/missing`` says how many)."""
        missing = self.missing
        trajs = self.sample(states, prompts, temperature=temperature)
        metrics = pass_at_1(trajs)
        solved = metrics["eval/accuracy"] * len(trajs)
        metrics.update({"eval/accuracy": solved / len(prompts), "eval/prompts": float(len(prompts)),
                        "eval/missing": float(self.missing - missing)})
        return metrics
