"""The rollout engine interface: token ids in, token ids + log-probs out.

An engine samples continuations of token sequences for many concurrent
episodes (asyncio). It never sees text: the agent loop owns tokenisation, so
the trajectory the learner trains on is exactly what the engine produced
(token-in/token-out, docs/algorithm.md §2). Every generated token carries the
learner version of the weights that produced it, because weights may be
swapped while a request is in flight (partial rollout, docs/algorithm.md §6).

Implementations: ``ScriptedEngine`` (tests), ``JaxEngine`` (embedded, CPU
default), ``SGLangEngine`` (HTTP client of an SGLang server).
"""
from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, Literal, Sequence

FinishReason = Literal["stop", "length"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length")


class EngineError(RuntimeError):
    """The engine could not serve a request (server down, retries exhausted)."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    Attributes:
      temperature: softmax temperature, > 0 for training rollouts; 0 means
        greedy (log-probs are then reported at temperature 1).
      top_p: nucleus mass in (0, 1]; 1 disables it.
      top_k: keep the k most likely tokens; 0 (or -1) disables it.
      max_new_tokens: upper bound on generated tokens, >= 1.
      stop_token_ids: generation stops after sampling any of these ids; the
        stop token is part of the completion (it was sampled, it has a
        log-prob) and the finish reason is ``"stop"``.

    Raises ValueError on out-of-range values.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if not (math.isfinite(self.temperature) and self.temperature >= 0.0):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be >= -1 (0 or -1 disable it), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be >= 0, got {self.stop_token_ids}")

    def replace(self, **changes: Any) -> "SamplingParams":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sampled continuation (engine output, host side).

    Attributes:
      tokens: generated token ids (the stop token included when
        ``finish_reason == "stop"``), length n >= 1.
      logprobs: n floats, log pi(token | prefix) at the sampling temperature
        (nats, <= 0).
      versions: n ints, learner policy version of the weights that produced
        each token; non-decreasing.
      finish_reason: ``"stop"`` (a stop token was sampled) or ``"length"``
        (``max_new_tokens`` or the engine's context limit was reached).

    Raises ValueError if the lists differ in length, are empty, or the finish
    reason is unknown.
    """

    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason

    def __post_init__(self):
        n = len(self.tokens)
        if n == 0:
            raise ValueError("a completion has at least one token")
        if len(self.logprobs) != n or len(self.versions) != n:
            raise ValueError(
                f"tokens/logprobs/versions lengths differ: {n}, {len(self.logprobs)}, "
                f"{len(self.versions)}")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, "
                             f"got {self.finish_reason!r}")


def check_prompt(prompt_tokens: Sequence[int]) -> list[int]:
    """Returns the prompt as a list of ints; raises ValueError if empty or negative."""
    tokens = [int(t) for t in prompt_tokens]
    if not tokens:
        raise ValueError("prompt_tokens is empty")
    if min(tokens) < 0:
        raise ValueError(f"prompt_tokens has a negative id: {min(tokens)}")
    return tokens


def check_sequences(sequences: Sequence[Sequence[int]]) -> list[list[int]]:
    """Sequences to score (``Engine.score``) as lists of ints; raises
    ValueError if there are none, or one has fewer than 2 ids or a negative id."""
    seqs = [[int(t) for t in s] for s in sequences]
    if not seqs:
        raise ValueError("no sequences to score")
    for s in seqs:
        if len(s) < 2 or min(s) < 0:
            raise ValueError(f"a scored sequence needs >= 2 ids, none negative; got {s[:8]}...")
    return seqs


class Engine(abc.ABC):
    """Abstract asynchronous rollout engine (one model, one weight version at a time)."""

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """Learner policy version of the weights now serving new tokens."""

    @abc.abstractmethod
    async def generate(self, prompt_tokens: Sequence[int], params: SamplingParams) -> Completion:
        """Samples one continuation of ``prompt_tokens`` (int ids, len >= 1).

        Safe to call concurrently from many episodes. Raises ValueError on bad
        input (empty prompt, prompt longer than the engine's context) and
        EngineError when the backend fails.
        """

    @abc.abstractmethod
    async def load_weights(self, version: int, uri: str) -> None:
        """Serves the published weights of learner ``version`` at ``uri`` for
        all later tokens.

        ``uri`` is a ``sao.ckpt.publish`` path (the orbax params for
        JaxEngine, its HF export for SGLang). In-flight requests are kept.
        Raises ValueError if ``version`` is lower than the current one or
        ``uri`` is not a string.
        """

    async def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-probs of given token sequences under the served weights, at
        temperature 1 (prompt / forced-decoding log-probs, nothing sampled).

        ``out[i][t]`` is ``log p(sequences[i][t] | sequences[i][:t])`` in nats
        for ``t >= 1`` and ``0.0`` for ``t = 0``: aligned as
        ``sao.models.token_logprobs`` (docs/architecture.md), which the
        learner compares them with (``sao.fleet.parity``). Raises
        NotImplementedError for engines that cannot score (this default),
        ValueError on bad input (an empty or too long sequence, an id outside
        the vocabulary), EngineError when the backend fails.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot score token sequences")

    @abc.abstractmethod
    async def health(self) -> bool:
        """True if the engine can serve a request now (never raises)."""

    async def close(self) -> None:
        """Releases resources (background tasks, HTTP sessions)."""
