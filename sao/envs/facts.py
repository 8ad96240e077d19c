"""The ``env/...`` metrics of a batch: means of the env facts its trajectories carry.

Env facts travel in ``Trajectory.metadata``, written by the env: the latency
model's sleep and injected failures (``sao.envs.latency``; a value that is
not a number is skipped) and the drift env's phase and quality
(``sao.envs.drift``).
"""
from __future__ import annotations

import numpy as np

from sao.types import metadata_error


def env_metrics(trajs) -> dict:
    """``env/...`` means of the trajectories' env facts: the latency model's sleep per episode
    (``env/tool_latency_s``) and injected tool failures (``env/tool_failures``) when on, and the
    drift env's metadata (``{}`` with neither)."""
    out = {}
    for key in ("tool_latency_s", "tool_failures"):
        vals = [float(t.metadata[key]) for t in trajs
                if isinstance(t.metadata, dict) and isinstance(t.metadata.get(key), (int, float))
                and not isinstance(t.metadata.get(key), bool)]
        if vals:
            out[f"env/{key}"] = float(np.mean(vals))
    # Only rows whose drift keys pass ``sao.types.metadata_error`` (the dispatcher drops the
    # others on arrival), so this never raises on worker data.
    drift = [t.metadata for t in trajs if isinstance(t.metadata, dict) and "phase" in t.metadata
             and metadata_error(t.metadata) is None]
    if not drift:
        return out
    return {**out, "env/learner_step": float(max(m["learner_step"] for m in drift)),
            "env/phase": float(max(m["phase"] for m in drift)),
            "env/phase_mean": float(np.mean([m["phase"] for m in drift])),
            "env/quality": float(np.mean([m["quality"] for m in drift])),
            "env/style_ok": float(np.mean([m["style_ok"] for m in drift]))}
