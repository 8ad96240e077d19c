"""Out-of-sweep seeds: do runs the sweep did not plan land inside the spread it reports?

The main comparison's numbers are means over ``base.SEEDS``; a reader should be able
to expect a new seed's run to look like those. ``HOLDOUT_SEEDS`` are seeds no table
uses, run with the same arms, commit and settings:

    python -m experiments.repro.sweep run --runs RUNS --arms m_sao,m_grpo,m_grpo_dis,m_vapo --seeds 100

Each held-out run's primary endpoint (area under the held-out learning curve,
``results.Run.auc``) and final pass@1 are set against the sweep's seeds of the same
arm: their range (min..max) and the 95% prediction interval for one new seed,
``mean ± t(0.975, n-1) · sd · sqrt(1 + 1/n)`` (normal seeds assumed). The paired
difference to ``m_sao`` on the held-out seed is set against the sweep's paired
differences the same way. Nothing here changes a verdict: it checks that the spread
RESULTS.md reports describes seeds it has not seen.
"""
from __future__ import annotations

import math

from experiments.repro import results

HOLDOUT_SEEDS = (100, 101)    # never in base.SEEDS (tests/experiments/test_repro_prereg.py)
MAIN_ARMS = ("m_sao", "m_grpo", "m_grpo_dis", "m_vapo")
ENDPOINTS = (("AUC", lambda r: r.auc()),
             ("final pass@1", lambda r: (r.evals() or [(None, None)])[-1][1]))


def prediction_interval(values, level: float = 0.95) -> tuple[float, float] | None:
    """``(low, high)``: where one more draw from the distribution of ``values`` falls with
    probability ``level`` (Student t, ``mean ± t · sd · sqrt(1 + 1/n)``: the half-width of
    ``results.t_interval``, ``t · sd / sqrt(n)``, times ``sqrt(n + 1)``). None for n < 2.
    Raises ValueError if ``level`` is not in (0, 1)."""
    values = [float(v) for v in values]
    ci = results.t_interval(values, level)
    if ci is None:
        return None
    mean, _, high = ci
    half = (high - mean) * math.sqrt(len(values) + 1)
    return mean - half, mean + half


def placement(value: float, reference) -> dict:
    """``value`` against ``reference`` values: ``{"range", "interval", "in_range",
    "in_interval"}`` (range = min..max; interval = :func:`prediction_interval`)."""
    ref = [float(v) for v in reference]
    pi = prediction_interval(ref)
    return {"range": (min(ref), max(ref)) if ref else None, "interval": pi,
            "in_range": bool(ref) and min(ref) <= value <= max(ref),
            "in_interval": pi is not None and pi[0] <= value <= pi[1]}


def _cell(value, where: dict, n: int) -> str:
    lo, hi = where["range"]
    pi = where["interval"]
    verdict = ("inside both" if where["in_range"] and where["in_interval"] else
               "inside the interval, outside the range" if where["in_interval"] else
               "**outside the interval**")
    return (f"{100 * value:.1f} | {100 * lo:.1f}..{100 * hi:.1f} | "
            f"[{100 * pi[0]:.1f}, {100 * pi[1]:.1f}] (n={n}) | {verdict}")


def rows(sweep_runs: dict, held_runs: dict) -> list[dict]:
    """One row per finished held-out run, endpoint and comparison (the arm alone, and the
    arm minus ``m_sao`` on the same seed): ``{"arm", "seed", "endpoint", "what", "value",
    **placement}`` against the same quantity over the sweep's finished seeds (n >= 2)."""
    out = []
    for name, value in ENDPOINTS:
        held_sao = {r.seed: value(r) for r in results.done(held_runs.get("m_sao", []))}
        for arm in MAIN_ARMS:
            base = [x for x in map(value, results.done(sweep_runs.get(arm, []))) if x is not None]
            diffs = results.paired(sweep_runs, arm, "m_sao", value)
            for r in results.done(held_runs.get(arm, [])):
                v = value(r)
                if v is None:
                    continue
                if len(base) >= 2:
                    out.append({"arm": arm, "seed": r.seed, "endpoint": name, "what": arm,
                                "value": float(v), "n": len(base), **placement(v, base)})
                if arm == "m_sao" or held_sao.get(r.seed) is None:
                    continue
                if len(diffs) >= 2:
                    d = float(v) - held_sao[r.seed]
                    out.append({"arm": arm, "seed": r.seed, "endpoint": name,
                                "what": f"{arm} − m_sao", "value": d, "n": len(diffs),
                                **placement(d, diffs)})
    return out


def markdown(runs: str, sweep_runs: dict) -> str:
    """RESULTS.md's section: the held-out seeds' runs in ``runs`` against ``sweep_runs``
    (``{arm: [results.Run]}`` of the sweep's seeds)."""
    held = results.load_all(runs, MAIN_ARMS, HOLDOUT_SEEDS)
    table = rows(sweep_runs, held)
    ran = sorted({t["seed"] for t in table})
    intro = (f"Seeds {', '.join(map(str, HOLDOUT_SEEDS))} are in no table above (finished so far: "
             f"{', '.join(map(str, ran)) or 'none'}): the main arms "
             "run on them (same commit and settings, their own SFT warm start) to check that the "
             "spread reported here describes seeds the sweep has not seen. Each held-out run's "
             "AUC and final pass@1, and its difference to `m_sao` on the same seed, against "
             "the sweep's seeds of that arm: their min..max and the 95% prediction interval for "
             "one new seed, mean ± t(0.975, n−1)·sd·√(1 + 1/n) "
             "(`experiments/repro/holdout.py`). Nothing here changes a verdict.\n\n")
    if not table:
        return intro + (f"No finished run of the held-out seeds {', '.join(map(str, HOLDOUT_SEEDS))} "
                "yet (`sweep run --arms m_sao,m_grpo,m_grpo_dis,m_vapo --seeds "
                f"{','.join(map(str, HOLDOUT_SEEDS))}`).")
    lines = ["| seed | quantity | endpoint | held-out seed (×100) | sweep min..max | "
             "95% prediction interval (n) | where |", "|---|---|---|---|---|---|---|"]
    for t in table:
        lines.append(f"| {t['seed']} | `{t['what']}` | {t['endpoint']} | "
                     f"{_cell(t['value'], t, t['n'])} |")
    inside = sum(t["in_interval"] for t in table)
    return intro + (f"{inside} of {len(table)} held-out quantities fall inside the 95% prediction "
            f"interval of the sweep's seeds ({sum(t['in_range'] for t in table)} inside its "
            "min..max; with 8 seeds a new seed falls outside their range with probability "
            "2/9 even when nothing differs).\n\n" + "\n".join(lines))
