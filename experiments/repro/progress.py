"""``sweep status``: each run's state, percent done and an ETA; the sweep's planned cost.

Progress is counted in learner steps (a run's planned ``run.steps`` from its
config, its done steps from ``metrics.jsonl``; a recorded run is whole).
The ETA is the remaining steps at the seconds per learner step measured on
the finished runs (their attempts' process seconds, start-up and
evaluations included), plus each SFT warm start (per seed and
``experiments.repro.sft_arm_of``) that is still needed; before any run has finished, the prior of ``base.PRIOR_S_PER_STEP``
(measured by the first sweep on this machine) is used and said so.
"""
from __future__ import annotations

import json
import os

from experiments.repro import base, records as rec, sft_arm_of, sweep


def _steps(arm: str, overrides) -> int:
    return int(sweep.arm_config(arm, 0, list(overrides)).run.steps)


def _seconds(d: str) -> float:
    path = os.path.join(d, sweep.ATTEMPTS_FILE)
    if not os.path.exists(path):
        return 0.0
    with open(path, encoding="utf-8") as f:
        return float(sum(a["seconds"] for a in json.load(f).get("runs", [])))


def measure(runs: str, todo, planned: dict, records: str | None) -> tuple[float | None, int, float | None]:
    """``(seconds per learner step, finished runs measured, mean SFT seconds)`` (None: none)."""
    secs = steps = n = 0
    for arm, seed in todo:
        for d in (sweep.run_dir(runs, arm, seed),
                  rec.record_dir(records, arm, seed) if records else None):
            if d and os.path.exists(os.path.join(d, sweep.SUMMARY_FILE)) and _seconds(d) > 0:
                secs, steps, n = secs + _seconds(d), steps + planned[arm], n + 1
                break
    sft = []
    roots = [os.path.join(top, name) for top in filter(None, (runs, records))
             if os.path.isdir(top) for name in sorted(os.listdir(top)) if name.startswith("_sft")]
    for root in roots:
        for seed_dir in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            for p in (os.path.join(root, seed_dir, "sft", "result.json"),
                      os.path.join(root, seed_dir, "result.json")):
                if os.path.exists(p):
                    with open(p, encoding="utf-8") as f:
                        sft.append(float(json.load(f).get("sft/seconds", 0.0)))
                    break
    return (secs / steps if steps else None), n, (sum(sft) / len(sft) if sft else None)


def status(runs: str, arms: list[str], seeds: list[int] | None, *, overrides=(),
           records: str | None = rec.RECORDS) -> str:
    """A plain-text table of each arm x seed's state, then percent done and an ETA."""
    todo = sweep.plan(arms, seeds)
    planned = {a: _steps(a, overrides) for a in arms}
    every = sorted({s for _, s in todo})
    lines = [f"{'arm':20s} " + " ".join(f"{'seed ' + str(s):>14s}" for s in every)]
    done_steps = total = 0
    left_sft = set()
    for arm in arms:
        cells = []
        for s in every:
            if (arm, s) not in todo:
                cells.append("-")
                continue
            st = sweep.run_state(runs, arm, s, records)
            k = planned[arm] if st == "done" else min(sweep.rl_steps_done(runs, arm, s), planned[arm])
            done_steps, total = done_steps + k, total + planned[arm]
            sft = sweep.sft_dir(runs, s, sft_arm_of(arm))
            if st != "done" and not os.path.exists(os.path.join(sft, "sft", "result.json")):
                left_sft.add((sft_arm_of(arm), s))
            cells.append(st if st in ("done", "pending") else f"{st} @{k}")
        lines.append(f"{arm:20s} " + " ".join(f"{c:>14s}" for c in cells))
    n_done = sum(sweep.run_state(runs, a, s, records) == "done" for a, s in todo)
    per_step, measured, sft_s = measure(runs, todo, planned, records)
    if per_step is None:
        per_step, source = base.PRIOR_S_PER_STEP, (f"the prior {base.PRIOR_S_PER_STEP} s per "
                                                   "learner step (no run finished yet)")
    else:
        source = f"{per_step:.1f} s per learner step measured on {measured} finished run(s)"
    sft_s = base.PRIOR_SFT_S if sft_s is None else sft_s
    eta = (total - done_steps) * per_step + len(left_sft) * sft_s
    pct = 100.0 * done_steps / total if total else 100.0
    lines.append(f"{n_done}/{len(todo)} runs done, {pct:.0f}% of {total} learner steps; "
                 f"ETA {eta / 3600:.1f} h at {source}, including {len(left_sft)} SFT warm "
                 f"start(s) of ~{sft_s / 60:.0f} min")
    return "\n".join(lines)


def planned_hours(arms: list[str], seeds: list[int] | None, overrides=()) -> float:
    """The whole sweep's cost at the priors (``base.PRIOR_S_PER_STEP``, ``PRIOR_SFT_S``), hours."""
    todo = sweep.plan(arms, seeds)
    steps = {a: _steps(a, overrides) for a in arms}
    return (sum(steps[a] for a, _ in todo) * base.PRIOR_S_PER_STEP
            + len({(sft_arm_of(a), s) for a, s in todo}) * base.PRIOR_SFT_S) / 3600
