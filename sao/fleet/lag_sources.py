"""Where policy lag comes from: time (and versions) in flight vs queued.

A trajectory's life at the learner: its lease is issued, the worker runs the
episode (*in flight*: generation, tool calls, their latency), the answer
arrives and waits (*queued*: in the dispatcher's buffer, or for the rest of
its GRPO group) until a batch takes it. Its staleness at training time is the
learner versions published in between; :func:`stamp_arrival` notes, when the
answer is accepted, the seconds in flight and the learner version then, and
:func:`lag_source_metrics` splits each batch's lag into the part accrued in
flight (stragglers) and the part accrued queued (the staleness budget, the
group barrier).

Stamps live in ``Trajectory.timings`` under the keys ``fleet_*``; what a worker
sent under those names is overwritten (workers are untrusted).
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from sao.types import Trajectory

IN_FLIGHT = "fleet_in_flight_s"       # lease issue -> answer accepted, seconds (learner clock)
ARRIVED = "fleet_arrived_unix"        # when the answer was accepted, time.time() seconds
VERSION = "fleet_version_at_arrival"  # learner version when the answer was accepted


def stamp_arrival(traj: Trajectory, lease_id: str, lease, version: int,
                  now: float | None = None) -> None:
    """Names ``traj`` by its lease and stamps its arrival (in place).

    Args:
      lease_id: becomes ``traj.trajectory_id``.
      lease: the settled ``sao.fleet.leases.Lease`` (``issued_at`` on the
        ``time.monotonic()`` clock), or None (no in-flight time then).
      version: the learner version now.
      now: ``time.monotonic()`` now (tests).
    """
    now = time.monotonic() if now is None else now
    traj.trajectory_id = lease_id
    for key in (IN_FLIGHT, ARRIVED, VERSION):
        traj.timings.pop(key, None)
    if lease is not None:
        traj.timings[IN_FLIGHT] = max(0.0, now - float(lease.issued_at))
    traj.timings[ARRIVED] = time.time()
    traj.timings[VERSION] = float(version)


def lag_source_metrics(trajs: Sequence[Trajectory], learner_version: int,
                       now_unix: float | None = None) -> dict[str, float]:
    """``lag/...`` means over the stamped trajectories of a batch ({} if none).

    * ``lag/in_flight_s``, ``lag/in_flight_s_p90``, ``lag/in_flight_s_max``:
      seconds from lease issue to arrival;
    * ``lag/queued_s``, ``lag/queued_s_max``: seconds from arrival to this batch;
    * ``lag/in_flight_versions``: learner versions published while in flight
      (version at arrival minus the version of the trajectory's first action token);
    * ``lag/queued_versions``: versions published while queued
      (``learner_version`` minus the version at arrival);
    * ``lag/queued_fraction``: queued versions / all versions (0 when no lag);
    * ``lag/episode_s_ratio_p90_p10``: spread of the episodes' in-flight times.
    """
    now_unix = time.time() if now_unix is None else now_unix
    stamped = [t for t in trajs if VERSION in t.timings and ARRIVED in t.timings]
    if not stamped:
        return {}
    first = [int(t.policy_version[t.action_mask].min()) if t.action_mask.any()
             else int(t.timings[VERSION]) for t in stamped]
    at_arrival = np.array([t.timings[VERSION] for t in stamped])
    flight_v = np.maximum(at_arrival - np.array(first), 0.0)
    queued_v = np.maximum(float(learner_version) - at_arrival, 0.0)
    queued_s = np.maximum(now_unix - np.array([t.timings[ARRIVED] for t in stamped]), 0.0)
    total_v = float(flight_v.sum() + queued_v.sum())
    out = {"lag/queued_s": float(queued_s.mean()), "lag/queued_s_max": float(queued_s.max()),
           "lag/in_flight_versions": float(flight_v.mean()),
           "lag/queued_versions": float(queued_v.mean()),
           "lag/queued_fraction": float(queued_v.sum()) / total_v if total_v else 0.0}
    flight_s = np.array([t.timings[IN_FLIGHT] for t in stamped if IN_FLIGHT in t.timings])
    if flight_s.size:
        p10, p90 = np.percentile(flight_s, [10, 90])
        out.update({"lag/in_flight_s": float(flight_s.mean()),
                    "lag/in_flight_s_p90": float(p90), "lag/in_flight_s_max": float(flight_s.max()),
                    "lag/episode_s_ratio_p90_p10": float(p90 / max(p10, 1e-6))})
    return out
