"""A simulated fleet workload for benchmarks and fleet tests.

``SimulatedEngine`` is an ``Engine`` whose latency grows linearly with the
number of tokens it generates (like a decoding server at fixed batch
occupancy): it emits ``chunk_tokens`` tokens per ``chunk_tokens *
seconds_per_token`` of sleep and stamps each chunk with the weights version
current at that moment, so a weight swap lands mid-episode (partial rollout).
``lognormal_prompts`` draws a long-tailed length distribution. Nothing here
learns; use it to exercise the dispatcher, staleness bound and gRPC path.
"""
from __future__ import annotations

import asyncio
import hashlib
from typing import Sequence

import numpy as np

from sao.rollout.base import Completion, Engine, SamplingParams, check_prompt
from sao.types import Trajectory


class SimulatedEngine(Engine):
    """Engine with latency ``seconds_per_token`` x generated tokens.

    Tokens are pseudo-random ids in ``[0, vocab_size)`` seeded by the prompt,
    log-probs uniform in ``logprob_range`` (nats); ``finish_reason`` is always
    ``"length"`` (it generates exactly ``params.max_new_tokens``). Raises
    ValueError on a negative latency, empty chunk or vocabulary, or a
    log-prob range outside ``(-inf, 0]``.
    """

    def __init__(self, *, seconds_per_token: float, chunk_tokens: int = 16,
                 vocab_size: int = 256, version: int = 0,
                 logprob_range: tuple[float, float] = (-3.0, -0.01)):
        if seconds_per_token < 0 or chunk_tokens < 1 or vocab_size < 1:
            raise ValueError("seconds_per_token >= 0, chunk_tokens >= 1, vocab_size >= 1 needed")
        if not -np.inf < logprob_range[0] <= logprob_range[1] <= 0.0:
            raise ValueError(f"logprob_range must be finite, ordered and <= 0: {logprob_range}")
        self.logprob_range = logprob_range
        self.seconds_per_token = seconds_per_token
        self.chunk_tokens = chunk_tokens
        self.vocab_size = vocab_size
        self._version = version
        self.weight_uris: list[str] = []
        self.tokens_generated = 0  # over all requests, updated per chunk

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_tokens: Sequence[int], params: SamplingParams) -> Completion:
        prompt = check_prompt(prompt_tokens)
        seed = int.from_bytes(hashlib.blake2b(np.asarray(prompt, np.int64).tobytes(),
                                              digest_size=8).digest(), "little")
        rng = np.random.default_rng(seed)
        n = params.max_new_tokens
        tokens = rng.integers(0, self.vocab_size, size=n).tolist()
        logprobs = rng.uniform(*self.logprob_range, size=n).tolist()
        versions: list[int] = []
        while len(versions) < n:
            k = min(self.chunk_tokens, n - len(versions))
            await asyncio.sleep(k * self.seconds_per_token)
            versions.extend([self._version] * k)
            self.tokens_generated += k
        return Completion(tokens=tokens, logprobs=logprobs, versions=versions,
                          finish_reason="length")

    async def load_weights(self, version: int, uri: str) -> None:
        if version < self._version:
            raise ValueError(f"version {version} is older than the current {self._version}")
        self._version = int(version)
        self.weight_uris.append(uri)

    async def health(self) -> bool:
        return True


def make_sim_episode_fn(engine: Engine, *, prompt_tokens: int = 8):
    """Episode function for ``sao.fleet.worker``: one action of
    ``prompt["length"]`` tokens after a ``prompt_tokens``-token prompt derived
    from ``prompt["prompt_id"]``; reward ``prompt.get("reward", 1.0)``."""

    async def episode(prompt: dict) -> Trajectory:
        length = int(prompt["length"])
        digest = hashlib.blake2b(str(prompt["prompt_id"]).encode(), digest_size=prompt_tokens)
        ptoks = [b % 256 for b in digest.digest()]
        c = await engine.generate(ptoks, SamplingParams(max_new_tokens=length))
        n_p = len(ptoks)
        return Trajectory(
            tokens=ptoks + c.tokens,
            action_mask=[False] * n_p + [True] * len(c.tokens),
            rollout_logprobs=[0.0] * n_p + c.logprobs,
            policy_version=[c.versions[0]] * n_p + c.versions,
            reward=float(prompt.get("reward", 1.0)), finish="stop",
            prompt_id=str(prompt["prompt_id"]), trajectory_id="")

    return episode


def lognormal_prompts(n: int, *, median: float, sigma: float, seed: int,
                      min_len: int = 1, max_len: int | None = None,
                      prefix: str = "p") -> list[dict]:
    """``n`` prompts ``{"prompt_id", "length", "reward"}`` with log-normal lengths
    (``median`` tokens, log-space std ``sigma``; p99/p50 = exp(2.326 sigma))."""
    rng = np.random.default_rng(seed)
    lengths = np.rint(median * np.exp(sigma * rng.standard_normal(n))).astype(int)
    lengths = np.clip(lengths, min_len, max_len if max_len is not None else None)
    rewards = rng.integers(0, 2, size=n)
    return [{"prompt_id": f"{prefix}{i}", "length": int(l), "reward": float(r)}
            for i, (l, r) in enumerate(zip(lengths, rewards))]
