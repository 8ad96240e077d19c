"""The instability pilot's reading of a run (docs/repro_pilot.md).

    python -m experiments.repro.pilot RUN_DIR [RUN_DIR ...]

For each run: steps done, the held-out pass@1 curve (``eval/accuracy``), the
actor's entropy every 10 steps, and the verdict of the pilot's criterion: a
run *degrades* when its last pass@1 is >= ``DROP`` points below its best, or
its entropy collapses (last below ``COLLAPSE`` x its first).
"""
from __future__ import annotations

import sys

from sao import run_metrics

DROP = 0.10          # 10 points of pass@1 below the run's best
COLLAPSE = 0.2       # entropy below 20% of its first value


def read_pilot(workdir: str) -> dict:
    """``{"steps", "pass1": [(step, acc)], "entropy": [(step, H)], "wall_s", "degraded", "why"}``;
    raises FileNotFoundError without metrics."""
    recs = run_metrics.read_metrics(workdir)
    rl = [r for r in recs if r.get("phase", "rl") == "rl"]
    pass1 = sorted((r["step"], r["eval/accuracy"]) for r in rl if "eval/accuracy" in r)
    ent = sorted((r["step"], r["actor/entropy"]) for r in rl if r.get("actor/entropy") is not None)
    steps = max((r["step"] for r in rl if "learner/step" in r), default=0)
    wall = max((r.get("time_s", 0.0) for r in rl if "learner/step" in r), default=0.0)
    why = []
    if len(pass1) >= 2:
        best = max(a for _, a in pass1)
        if best - pass1[-1][1] >= DROP:
            why.append(f"pass@1 {100 * pass1[-1][1]:.1f}% is {100 * (best - pass1[-1][1]):.1f} "
                       f"points below its best {100 * best:.1f}%")
    if len(ent) >= 2 and ent[0][1] > 0 and ent[-1][1] < COLLAPSE * ent[0][1]:
        why.append(f"entropy collapsed {ent[0][1]:.3f} -> {ent[-1][1]:.3f}")
    return {"steps": steps, "pass1": pass1, "entropy": ent, "wall_s": wall,
            "degraded": bool(why), "why": "; ".join(why)}


def describe(workdir: str) -> str:
    p = read_pilot(workdir)
    curve = ", ".join(f"{s}: {100 * a:.1f}" for s, a in p["pass1"])
    ent = ", ".join(f"{s}: {h:.3f}" for s, h in p["entropy"] if s % 10 == 0 or s == 1)
    verdict = f"DEGRADED ({p['why']})" if p["degraded"] else "did not degrade"
    rate = f", {p['wall_s'] / p['steps']:.1f} s/step" if p["steps"] else ""
    return (f"{workdir}: {p['steps']} steps in {p['wall_s'] / 60:.1f} min{rate}; {verdict}\n"
            f"  pass@1 % by step: {curve}\n  entropy by step: {ent}")


if __name__ == "__main__":
    for d in sys.argv[1:]:
        print(describe(d))
