"""Round two of the reproduction: the testbed with the mechanisms the paper's claims need.

Every ``m_*`` arm is a round-one arm (experiments/repro/base.py: same tiny
policy, SFT warm start, task, fleet, batch) passed through :func:`mech`,
which turns on what round one lacked (issue "paper claims, round two"):

* **train/inference mismatch**: the rollout engine serves bf16 weights beside
  the f32 learner (``rollout.engine_dtype``), so ratios differ from 1 at lag 0;
* **stragglers**: each tool call sleeps a lognormal wall-clock time (median
  ``LATENCY_S``, sigma 1.5, capped) and fails with probability ``FAILURE_RATE``
  (the policy sees an error and may call again: up to ``TOOL_CALLS`` calls), so
  episode durations vary > 10x, policy lag accrues in flight and the GRPO
  group barrier waits for its slowest member;
* **a critic that matters**: a state after a failed call is worth less than
  one after a result; every critic is also scored each evaluation on a fixed
  held-out episode set (``eval.value_episodes``: eval/value_mse, eval/explained_variance);
* **instability within budget**: ``STEPS`` actor updates at ``ACTOR_LR`` (the
  pilot's setting, docs/repro_pilot.md);
* **visible drift** (``m_drift_*``): the SFT warm start demonstrates every
  answer style (``DRIFT_STYLE_MIX``), phases of ``DRIFT_PHASE`` steps.

Seeds: ``MAIN_SEEDS`` for the main comparison, ``SIDE_SEEDS`` for the others
(budget: docs/repro_pilot.md "Sweep budget").
"""
from __future__ import annotations

import ml_collections

from experiments.repro import base

STEPS = 40                    # actor updates per run (non-drift m_ arms; + a critic's warm-up steps)
ACTOR_LR = 6e-4               # between round one (2e-4, nothing collapsed) and the pilot (>= 2e-3: all collapsed); untested, docs/repro_pilot.md
LATENCY_S = 1.0               # median tool latency, seconds (lognormal, sigma LATENCY_SIGMA)
LATENCY_SIGMA = 1.5
LATENCY_MAX_S = 20.0
FAILURE_RATE = 0.2            # transient tool failures (retry)
TOOL_CALLS = 3                # tool calls per episode (room for a retry); turns = calls + 1
VALUE_EPISODES = 64           # fixed held-out episodes every critic is scored on
MAIN_SEEDS = base.SEEDS       # main comparison: m_sao, m_grpo, m_grpo_dis, m_vapo (8)
SIDE_SEEDS = base.SECONDARY_SEEDS  # critic, wall-clock and drift arms (4); base.seeds_of
DRIFT_PHASE = 40              # learner steps per drift phase (one switch at 40; 80 actor updates)
DRIFT_SWITCHES = (DRIFT_PHASE,)   # env.drift_schedule of the m_drift_* arms
DRIFT_STYLE_MIX = "bare:0.7,sentence:0.15,boxed:0.15"


def mech(c: ml_collections.ConfigDict, arg: str | None, *, name: str,
         tau: int = base.TAU, steps: int = STEPS) -> ml_collections.ConfigDict:
    """``base.repro`` at ``steps`` actor updates, then the mechanisms above; returns ``c``."""
    c = base.repro(c, arg, name=name, tau=tau, steps=steps)
    c.learner.actor_lr = ACTOR_LR
    c.rollout.engine_dtype = "bfloat16"
    c.env.tool_latency_median_s = LATENCY_S
    c.env.tool_latency_sigma = LATENCY_SIGMA
    c.env.tool_latency_max_s = LATENCY_MAX_S
    c.env.tool_failure_rate = FAILURE_RATE
    c.env.max_tool_calls = TOOL_CALLS
    c.rollout.max_turns = TOOL_CALLS + 1
    c.eval.value_episodes = VALUE_EPISODES
    return c


def drift(c: ml_collections.ConfigDict, arg: str | None, *, name: str) -> ml_collections.ConfigDict:
    """``mech`` for an online-drift arm: a mixed-style warm start, phases of ``DRIFT_PHASE`` steps."""
    c = mech(c, arg, name=name, steps=2 * DRIFT_PHASE)
    c.sft.style_mix = DRIFT_STYLE_MIX
    c.env.drift_schedule = DRIFT_SWITCHES
    return c
