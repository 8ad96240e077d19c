"""A worker episode driven by a harness through the endpoint.

``harness_episode_fn`` builds the worker's episode function (the
``EpisodeFn`` of sao/fleet/worker.py): per leased prompt it opens an
endpoint session, runs the harness against that session's URL with the run's
token, and turns the session into the ``Trajectory`` the fleet ships like any
other. The harness returns the reward (it graded the episode, e.g. the
repository's tests); what went wrong is counted on the endpoint
(``harness_timeouts``, ``harness_errors``) and recorded in the trajectory's
metadata (``harness_error``).

A harness ending because the endpoint ended the session (history rewrite,
context or turn budget, truncated action) is not a harness error: the
trajectory keeps the session's finish (``"length"``). Any other exception
makes the episode ``finish="error"`` (reward 0), as an environment failure
does in the native agent loop.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Mapping, Protocol

from sao.fleet.endpoint.server import Endpoint
from sao.rollout.base import SamplingParams
from sao.types import Trajectory


@dataclasses.dataclass(frozen=True)
class HarnessResult:
    """What a harness reports after an episode: the graded reward, JSON-able
    facts, and whether the harness stopped on its own limit (step limit,
    repeated format errors) instead of finishing: then ``finish="length"``,
    reward 0, as a truncated native episode."""

    reward: float
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    truncated: bool = False


class Harness(Protocol):
    async def run(self, prompt: Mapping[str, Any], base_url: str, api_key: str) -> HarnessResult:
        """Runs one episode against an OpenAI-compatible ``base_url``; raises on failure."""


def harness_episode_fn(endpoint: Endpoint, harness: Harness, sampling: SamplingParams, *,
                       max_turns: int, max_total_tokens: int, timeout_s: float = 1800.0):
    """``async episode(prompt, temperature=None) -> Trajectory`` for ``sao.fleet.worker``.

    Args:
      endpoint: the worker's started ``Endpoint`` (same engine as the worker).
      harness: runs an episode given a base URL and an API key.
      sampling: the run's sampling; a lease's ``temperature`` replaces its own.
      max_turns, max_total_tokens: the session's limits.
      timeout_s: wall seconds for the whole episode; then the session is
        abandoned (counted ``harness_timeouts``) and the harness's later
        calls get ``session_ended``.
    Raises ValueError (from ``Session.trajectory``) when the harness failed
    before the first action: the worker reports the episode as failed.
    """

    async def episode(prompt: dict, temperature: float | None = None) -> Trajectory:
        params = sampling if temperature is None else sampling.replace(temperature=temperature)
        session = endpoint.open_session(params, max_turns=max_turns,
                                        max_total_tokens=max_total_tokens)
        reward, finish, meta = 0.0, None, {}
        t0 = time.perf_counter()
        try:
            result = await asyncio.wait_for(
                harness.run(prompt, endpoint.base_url(session), endpoint.config.token), timeout_s)
            reward, meta = float(result.reward), dict(result.metadata)
            if result.truncated:
                session.abandon("harness_limit")
            session.done()
        except asyncio.TimeoutError:
            endpoint.counters["harness_timeouts"] += 1
            session.abandon("timeout")
            meta["harness_error"] = f"timeout after {timeout_s} s"
        except Exception as e:  # the harness failed (or stopped on an endpoint error)
            meta["harness_error"] = f"{type(e).__name__}: {e}"[:500]
            if not session.ended:
                endpoint.counters["harness_errors"] += 1
                finish = "error"
        finally:
            endpoint.close_session(session, "episode_over")
        traj = session.trajectory(reward, prompt_id=str(prompt.get("prompt_id", "")),
                                  finish=finish, metadata=meta)
        traj.timings["total_s"] = time.perf_counter() - t0
        return traj

    return episode
