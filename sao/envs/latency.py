"""Straggling tools: heavy-tailed wall-clock latency and transient failures.

Real agent tools (search, code execution on a busy cluster, web APIs) answer
in a time with a heavy right tail and sometimes fail transiently. On a tiny
CPU testbed the sandboxed tool answers in milliseconds, so episodes finish in
nearly the same time and policy lag comes only from queueing. This model adds,
per tool call, a lognormal sleep (``asyncio.sleep``: wall-clock, no CPU) and,
with some probability, a failure that the policy sees as an error observation
and must retry (states after a failure are worth less: the critic has
something to learn).

Each episode draws from its own generator, seeded by the run's seed, the
prompt id and the episode's serial number in this process.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import zlib

import numpy as np

_EPISODES = itertools.count()   # episode serials in this process (seed of each episode's draws)

FAILURE_TEXT = "[tool error] the tool is temporarily unavailable; call it again"


@dataclasses.dataclass(frozen=True)
class ToolLatency:
    """Per-call latency and failure model.

    Attributes:
      median_s: median sleep per tool call, seconds (0 = no sleep).
      sigma: lognormal shape (std of log seconds; 1.5 -> p99/median ~ 33x).
      max_s: sleeps are capped here, seconds.
      failure_rate: probability in [0, 1) that a call fails without running.
      seed: run seed of the draws.

    Raises ValueError on a negative median, sigma or cap, or a rate outside [0, 1).
    """

    median_s: float = 0.0
    sigma: float = 1.5
    max_s: float = 60.0
    failure_rate: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if self.median_s < 0 or self.sigma < 0 or self.max_s < 0:
            raise ValueError(f"latency median_s, sigma, max_s must be >= 0, got {self}")
        if not 0.0 <= self.failure_rate < 1.0:
            raise ValueError(f"failure_rate must be in [0, 1), got {self.failure_rate}")

    @property
    def enabled(self) -> bool:
        return self.median_s > 0 or self.failure_rate > 0

    def episode(self, prompt_id: str) -> "EpisodeDraws":
        """The draws of one new episode of ``prompt_id``."""
        key = [int(self.seed) & 0xFFFFFFFF, zlib.crc32(prompt_id.encode()), next(_EPISODES)]
        return EpisodeDraws(self, np.random.default_rng(key))


class EpisodeDraws:
    """One episode's sequence of ``(sleep seconds, failed)`` per tool call."""

    def __init__(self, model: ToolLatency, rng: np.random.Generator):
        self.model, self._rng = model, rng

    def next_call(self) -> tuple[float, bool]:
        m = self.model
        delay = 0.0
        if m.median_s > 0:
            delay = min(m.max_s, float(m.median_s * math.exp(m.sigma * self._rng.standard_normal())))
        failed = bool(m.failure_rate > 0 and self._rng.random() < m.failure_rate)
        return delay, failed
