"""RESULTS.md's verdict table, budget ledger and evaluation-noise sentence (``sweep report``).

Verdict words come only from ``results.verdict`` applied to the claims of
``experiments.repro.claims`` (the pre-registered rule): this module renders,
it decides nothing.
"""
from __future__ import annotations

import numpy as np

from experiments.repro import claims as claims_mod, results
from experiments.repro.results import done

BUDGET_KEYS = ("generated", "trained", "dropped", "pretraining")


def _fmt(x, scale: float) -> str:
    return "—" if x is None else f"{scale * x:+.2f}" if abs(scale * x) < 10 else f"{scale * x:+.1f}"


def verdict_table(runs_by_arm) -> str:
    """One row per pre-registered claim: pair, endpoint, n, mean difference with its 95%
    interval, the verdict of the rule and the design's minimum detectable effect."""
    rows = ["| claim | pair (arm − reference) | endpoint | n | mean difference [95% interval] "
            "| verdict | detectable effect (80% power) |", "|---|---|---|---|---|---|---|"]
    for c in claims_mod.CLAIMS:
        v = claims_mod.evaluate(runs_by_arm, c)
        scale = 100.0 if c.endpoint in ("auc", "final", "collapsed", "ev_first", "ev_last") else 1.0
        unit = " (×100)" if scale == 100.0 else ""
        diff = ("—" if v["mean"] is None else
                f"{_fmt(v['mean'], scale)} [{_fmt(v['low'], scale)}, {_fmt(v['high'], scale)}]")
        mde = "—" if v["mde"] is None else f"{scale * v['mde']:.2f}"
        word = v["verdict"] if v["verdict"] != "inconclusive at this n" else (
            f"inconclusive at this n (n = {v['n']})")
        want = "> 0" if c.direction > 0 else "< 0"
        if c.margin:
            want = f"> −{scale * c.margin:g}"
        rows.append(f"| {c.id}. {c.text} | `{c.arm}` − `{c.ref}` ({want}) | "
                    f"{claims_mod.ENDPOINTS[c.endpoint][0]}{unit} | {v['n']} | {diff} | "
                    f"**{word}** | {mde} |")
    return "\n".join(rows)


def budget_cell(runs) -> str:
    """Mean trajectories per finished run: ``generated / trained / dropped / pretraining``
    (``summary.json``'s ``budget``; '—' for runs that predate it)."""
    b = [r.summary["budget"] for r in done(runs) if r.summary and "budget" in r.summary]
    if not b:
        return "—"
    return " / ".join(f"{np.mean([x[k] for x in b]):.0f}" for k in BUDGET_KEYS)


BUDGET_HEADER = "trajectories: generated / trained / dropped / pretraining"


def budget_table(runs_by_arm) -> str:
    """Every arm's ledger: actor updates, actor and critic-only trajectories and the rest."""
    keys = ("actor_updates", "actor_trajectories", "critic_only_trajectories", "pretraining",
            "dropped", "generated")
    rows = ["| arm | " + " | ".join(k.replace("_", " ") for k in keys) + " |",
            "|---|" + "---|" * len(keys)]
    for arm, runs in runs_by_arm.items():
        b = [r.summary["budget"] for r in done(runs) if r.summary and "budget" in r.summary]
        cells = [f"{np.mean([x[k] for x in b]):.0f}" if b else "—" for k in keys]
        rows.append(f"| `{arm}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def eval_noise(runs_by_arm, arm: str = "m_sao", ref: str = "m_grpo") -> str:
    """The evaluation's own noise in a paired difference, from the per-prompt solved counts
    of the two arms' final evaluations on the same prompts (same seed): the standard
    error of the mean per-prompt difference, so the pairing (shared prompts) is respected
    and only held-out-pass@1 arms of one comparison enter (no drift arm, whose eval is
    another measure)."""
    refs = {r.seed: r for r in done(runs_by_arm.get(ref, []))}
    ses = []
    for r in done(runs_by_arm.get(arm, [])):
        o = refs.get(r.seed)
        a, b = _final_solved(r), _final_solved(o) if o is not None else None
        if a is None or b is None or len(a) != len(b) or not a:
            continue
        k = r.summary.get("eval_samples_per_prompt", 1)
        d = (np.asarray(a, float) - np.asarray(b, float)) / k
        ses.append(float(np.std(d, ddof=1) / np.sqrt(d.size)))
    if not ses:
        return (f"(The evaluation noise of a paired difference needs the per-prompt results of "
                f"finished `{arm}` and `{ref}` runs of one seed; none yet.)")
    return (f"Evaluation noise alone: the final pass@1 of `{arm}` − `{ref}` on one seed, from "
            f"the per-prompt differences on their shared held-out prompts, has a standard error "
            f"of {100 * min(ses):.1f}-{100 * max(ses):.1f} points ({len(ses)} seed(s)); the "
            "seed-to-seed spread of the paired differences, which the intervals use, includes it.")


def _final_solved(run):
    if run is None:
        return None
    last = [r for r in run.rl if "eval/solved_per_prompt" in r]
    return last[-1]["eval/solved_per_prompt"] if last else None
