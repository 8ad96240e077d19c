"""A scripted engine: replays given completions, for tests of code above engines.

It behaves like a real engine at the interface (stop tokens, ``max_new_tokens``,
versions, weight loads, concurrency) but its tokens come from a script, so
agent-loop and fleet tests can assert trajectories exactly.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Sequence

from sao.rollout.base import Completion, Engine, EngineError, SamplingParams, check_prompt


@dataclasses.dataclass(frozen=True)
class ScriptedTurn:
    """One scripted completion.

    Attributes:
      tokens: ids the engine "samples", in order.
      logprobs: one log-prob per token (default ``-0.1 * (i + 1)`` for token i).
      swap_to: optional ``{index: version}``: before emitting token ``index``
        the engine switches to ``version`` (a weight swap mid-generation).
    """

    tokens: Sequence[int]
    logprobs: Sequence[float] | None = None
    swap_to: dict[int, int] | None = None

    def __post_init__(self):
        if not self.tokens:
            raise ValueError("a scripted turn needs at least one token")
        if self.logprobs is not None and len(self.logprobs) != len(self.tokens):
            raise ValueError("logprobs must have one entry per token")


class ScriptedEngine(Engine):
    """Replays ``script`` one turn per ``generate`` call, in call order.

    Stop tokens and ``max_new_tokens`` cut a turn as a real engine would
    (the stop token is kept). ``prompts`` records every prompt received, so a
    test can check that the agent loop sent exactly the trajectory so far.
    Raises EngineError when the script is exhausted.
    """

    def __init__(self, script: Sequence[ScriptedTurn | Sequence[int]], *, version: int = 0,
                 delay_s: float = 0.0):
        self._script = [t if isinstance(t, ScriptedTurn) else ScriptedTurn(list(t)) for t in script]
        self._next = 0
        self._version = int(version)
        self._delay_s = delay_s
        self.prompts: list[list[int]] = []
        self.loads: list[tuple[int, str]] = []

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_tokens: Sequence[int], params: SamplingParams) -> Completion:
        prompt = check_prompt(prompt_tokens)
        if self._next >= len(self._script):
            raise EngineError(f"script exhausted after {self._next} completions")
        turn = self._script[self._next]
        self._next += 1
        self.prompts.append(prompt)
        stops = set(params.stop_token_ids)
        tokens, logprobs, versions = [], [], []
        finish = "length"
        for i, tok in enumerate(turn.tokens):
            if i >= params.max_new_tokens:
                break
            if turn.swap_to and i in turn.swap_to:
                self._version = max(self._version, int(turn.swap_to[i]))
            if self._delay_s:
                await asyncio.sleep(self._delay_s)
            tokens.append(int(tok))
            logprobs.append(float(turn.logprobs[i]) if turn.logprobs is not None
                            else -0.1 * (i + 1))
            versions.append(self._version)
            if tok in stops:
                finish = "stop"
                break
        return Completion(tokens, logprobs, versions, finish)

    async def load_weights(self, version: int, uri: str) -> None:
        if version < self._version:
            raise ValueError(f"version {version} is older than the served {self._version}")
        self._version = int(version)
        self.loads.append((int(version), uri))

    async def health(self) -> bool:
        return True
