"""The agent loop: one episode of engine turns and environment steps, token-in/token-out.

The trajectory is built only from ids: the prompt ids the environment gives,
the ids the engine sampled (with their log-probs and versions) and the ids of
the observations we frame and append. Earlier turns are never re-tokenised:
each engine call continues the exact id sequence of the trajectory so far.
Text exists only for the environment, which reads the decoded action and
answers with observation text (docs/algorithm.md §2).

Episode end:
* the environment says ``done`` after an action, or the action ends with a
  terminal token (``<eos>``): ``finish="stop"``, reward from the environment;
* an engine turn ends by length, ``max_turns`` actions were taken, or the next
  observation or action would not fit in ``max_total_tokens``:
  ``finish="length"``, reward 0 **[ours: truncated episodes score 0]**;
* the environment raises: ``finish="error"``, reward 0, the error in metadata.
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
import uuid
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from sao.rollout.base import Engine, SamplingParams
from sao.types import Trajectory


@dataclasses.dataclass(frozen=True)
class TurnFormat:
    """How an action ends (token ids) and how an observation is framed (text).

    Attributes:
      stop_token_ids: ids that end an engine turn (the env then reads it).
      terminal_token_ids: ids that end the whole episode whatever the env says.
      observation_prefix / observation_suffix: text put around the
        observation (for chat models they also close the tool turn and open
        the next assistant turn). The frame and the observation are encoded
        as **one** string, as the chat template's rendering is tokenised: a
        BPE pre-tokenizer merges whitespace across the seams (``"\n"`` +
        ``"  391"`` is not ``"\n  391"``), so encoding them apart gives other
        ids than the model saw in training for output with leading or
        trailing whitespace.
    """

    stop_token_ids: tuple[int, ...]
    terminal_token_ids: tuple[int, ...] = ()
    observation_prefix: str = ""
    observation_suffix: str = ""

    def observation_tokens(self, tokenizer, text: str) -> list[int]:
        """Ids of the framed observation: ``encode(prefix + text + suffix)``."""
        return tokenizer.encode(self.observation_prefix + text + self.observation_suffix)


def byte_tool_format(tokenizer) -> TurnFormat:
    """Tiny byte-level models: stop on ``</python>``, ``</answer>``, ``<eos>``;
    observations are ``<output>text</output>``; ``<eos>`` ends the episode."""
    ids = tokenizer.special_ids
    return TurnFormat(
        stop_token_ids=(ids["</python>"], ids["</answer>"], tokenizer.eos_id),
        terminal_token_ids=(tokenizer.eos_id,),
        observation_prefix="<output>", observation_suffix="</output>")


def chatml_tool_format(tokenizer, *, role: str = "user") -> TurnFormat:
    """ChatML models (Qwen3, SmolLM2): a turn ends with ``<|im_end|>``; the
    observation is a ``<tool_response>`` block in a ``role`` turn followed by
    an open assistant turn: exactly what Qwen3's chat template renders for a
    ``tool`` message after an assistant tool call (the Hermes convention; a
    plain ChatML template renders the same for a ``user`` message holding the
    block). The environment parses the model's native tool calls."""
    end_of_turn = tokenizer.special_ids.get("<|im_end|>")
    return TurnFormat(
        stop_token_ids=tuple(tokenizer.stop_ids),
        terminal_token_ids=tuple(i for i in tokenizer.stop_ids if i != end_of_turn),
        observation_prefix=f"\n<|im_start|>{role}\n<tool_response>\n",
        observation_suffix="\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


class _Builder:
    """Accumulates the per-token arrays of one trajectory."""

    def __init__(self):
        self.tokens: list[int] = []
        self.mask: list[bool] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []

    def add_context(self, ids: Sequence[int], version: int):
        self.tokens += ids
        self.mask += [False] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [version] * len(ids)

    def add_action(self, completion):
        self.tokens += completion.tokens
        self.mask += [True] * len(completion.tokens)
        self.logprobs += completion.logprobs
        self.versions += completion.versions


async def _env_call(fn: Callable, *args):
    """Awaits an async env method, or runs a sync one in a thread (tools may block)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    return await asyncio.to_thread(fn, *args)


def _prompt_ids(reset_out, tokenizer) -> list[int]:
    if isinstance(reset_out, str):
        return tokenizer.encode(reset_out)
    if isinstance(reset_out, (list, tuple, np.ndarray)):
        return [int(t) for t in reset_out]
    raise TypeError(f"env.reset must return token ids or text, got {type(reset_out).__name__}")


async def run_episode(engine: Engine, env, tokenizer, prompt: Any, sampling: SamplingParams, *,
                      max_turns: int, max_total_tokens: int,
                      turn_format: TurnFormat | None = None,
                      prompt_id: str | None = None) -> Trajectory:
    """Runs one episode and returns its trajectory.

    Args:
      engine: any ``Engine``; called with the full id sequence so far.
      env: ``reset(prompt) -> text`` (encoded once; or token ids) and
        ``step(action_text) -> StepResult(observation_text, done, reward, info)``;
        an ``astep`` coroutine is preferred to ``step``; sync methods run in
        a worker thread.
      tokenizer: decodes actions for the env, encodes observations.
      prompt: what ``env.reset`` takes (a task record).
      sampling: per-turn sampling; its ``max_new_tokens`` is capped by the
        remaining token budget; ``turn_format.stop_token_ids`` are added to
        its stop ids.
      max_turns: most engine turns (actions), >= 1.
      max_total_tokens: most tokens in the whole trajectory, prompt included.
      turn_format: defaults to ``byte_tool_format(tokenizer)``.
      prompt_id: stored in the trajectory (default ``prompt["prompt_id"]`` or ``prompt["id"]`` if
        the prompt has one, else ``""``).

    Returns a ``Trajectory`` whose tokens are the prompt ids, the engine's ids
    (``action_mask`` True, engine log-probs and versions) and the observation
    ids (mask False, log-prob 0, the engine version when appended).
    Raises ValueError if the limits are < 1 or the prompt leaves no room for
    an action; EngineError from the engine propagates (the episode is lost).
    """
    if max_turns < 1 or max_total_tokens < 2:
        raise ValueError(f"max_turns >= 1 and max_total_tokens >= 2 needed, "
                         f"got {max_turns}, {max_total_tokens}")
    fmt = turn_format or byte_tool_format(tokenizer)
    stops = tuple(dict.fromkeys(sampling.stop_token_ids + fmt.stop_token_ids))
    if prompt_id is None:
        keys = ("prompt_id", "id") if isinstance(prompt, Mapping) else ()
        key = next((k for k in keys if k in prompt), None)
        prompt_id = str(prompt[key]) if key else ""
    t_start = time.perf_counter()
    timings = {"generate_s": 0.0, "tool_s": 0.0}

    t0 = time.perf_counter()
    prompt_tokens = _prompt_ids(await _env_call(env.reset, prompt), tokenizer)
    timings["tool_s"] += time.perf_counter() - t0
    if not prompt_tokens or len(prompt_tokens) >= max_total_tokens:
        raise ValueError(f"prompt of {len(prompt_tokens)} tokens leaves no room in "
                         f"max_total_tokens={max_total_tokens}")
    traj = _Builder()
    traj.add_context(prompt_tokens, engine.version)

    reward, finish, info, turns, tool_calls = 0.0, "length", {}, 0, 0
    metadata: dict[str, Any] = {}
    while True:
        budget = min(sampling.max_new_tokens, max_total_tokens - len(traj.tokens))
        t0 = time.perf_counter()
        completion = await engine.generate(
            traj.tokens, sampling.replace(max_new_tokens=budget, stop_token_ids=stops))
        timings["generate_s"] += time.perf_counter() - t0
        traj.add_action(completion)
        turns += 1
        if completion.finish_reason == "length":
            metadata["truncated"] = "max_new_tokens" if budget == sampling.max_new_tokens \
                else "max_total_tokens"
            break
        t0 = time.perf_counter()
        try:
            result = await _env_call(getattr(env, "astep", None) or env.step,
                                     tokenizer.decode(completion.tokens))
        except Exception as e:  # the environment failed, not the policy
            finish, metadata["error"] = "error", f"{type(e).__name__}: {e}"
            break
        finally:
            timings["tool_s"] += time.perf_counter() - t0
        info = dict(result.info or {})
        if result.done or completion.tokens[-1] in fmt.terminal_token_ids:
            finish, reward = "stop", float(result.reward)
            break
        tool_calls += 1
        if turns >= max_turns:
            metadata["truncated"] = "max_turns"
            break
        obs = fmt.observation_tokens(tokenizer, result.observation_text or "")
        if len(traj.tokens) + len(obs) >= max_total_tokens:
            metadata["truncated"] = "max_total_tokens"
            break
        traj.add_context(obs, engine.version)

    timings["total_s"] = time.perf_counter() - t_start
    metadata.update(info)
    metadata.update(num_turns=turns, num_tool_calls=tool_calls)
    return Trajectory(tokens=traj.tokens, action_mask=traj.mask,
                      rollout_logprobs=traj.logprobs, policy_version=traj.versions,
                      reward=reward, finish=finish, prompt_id=prompt_id,
                      trajectory_id=uuid.uuid4().hex, metadata=metadata, timings=timings)


async def run_episodes(engine: Engine, make_env: Callable[[], Any], tokenizer,
                       prompts: Sequence[Any], sampling: SamplingParams, *,
                       concurrency: int = 16, **episode_kwargs) -> list[Trajectory]:
    """Runs one episode per prompt (single rollout), ``concurrency`` at a time,
    each with a fresh env from ``make_env()``; results in prompt order."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt):
        async with gate:
            return await run_episode(engine, make_env(), tokenizer, prompt, sampling,
                                     **episode_kwargs)

    return list(await asyncio.gather(*(one(p) for p in prompts)))
