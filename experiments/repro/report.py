"""RESULTS.md and docs/repro_*.png from the sweep's recorded runs (``sweep report``).

Every number comes from ``RUNS/<arm>/seed<S>/{summary.json, metrics.jsonl}``
(`experiments.repro.results`) or the explained-variance study's
``RUNS/_ev/ev_study.json`` (`experiments.repro.ev_study`); a run that has not
finished is listed as pending / partial and left out of the means. The
hand-written discussion is ``experiments/repro/discussion.md``, inserted as is.
"""
from __future__ import annotations

import json
import os
import platform
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments.repro import ALL_ARMS, ARMS, base, ev_study, holdout, mech, results, sweep, verdicts  # noqa: E402
from experiments.repro.verdicts import BUDGET_HEADER, budget_cell  # noqa: E402
from experiments.repro.results import done, pct, stat  # noqa: E402

DISCUSSION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "discussion.md")
GROUPS = {a: g for a, g, _ in ARMS}
TITLES = {a: t for a, _, t in reversed(ALL_ARMS)}     # round two's titles win
MAIN = [a for a, g, _ in ARMS if g == "main"]
CRITIC = ["m_sao", "m_sao_k1", "m_sao_full_critic", "m_sao_no_pretrain", "m_vapo"]
STALENESS = [(a, base.TAU) for a in MAIN]             # round two: lag from stragglers at one τ
DRIFT = ["m_drift_sao", "m_drift_running_mean"]
DRIFT_SWITCHES = mech.DRIFT_SWITCHES                  # learner steps (mech.drift)
WALLCLOCK = ["m_sao", "m_grpo_sync"]


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _present(runs_by_arm, arms):
    return [a for a in arms if a in runs_by_arm]


def status_table(runs_by_arm) -> str:
    seeds = sorted({r.seed for runs in runs_by_arm.values() for r in runs})
    rows = []
    for arm, runs in runs_by_arm.items():
        by_seed = {r.seed: r for r in runs}
        cells = []
        for s in seeds:
            r = by_seed.get(s)
            steps = max((x for x, _ in r.series("learner/step")), default=0) if r else 0
            cells.append("—" if r is None else r.state if r.state in ("done", "pending", "dirty")
                         else f"{r.state} ({steps} steps)")
        rows.append([f"`{arm}`", TITLES[arm], *cells])
    return _table(["arm", "what", *[f"seed {s}" for s in seeds]], rows)


def main_table(runs_by_arm) -> str:
    rows = []
    for arm in _present(runs_by_arm, MAIN + CRITIC[1:4] + ["m_grpo_sync"]):
        d = done(runs_by_arm[arm])
        before = [r.summary["accuracy_before"] for r in d]
        after = [r.summary["accuracy_after"] for r in d]
        best = [max(a for _, a in r.evals()) for r in d if r.evals()]
        collapses = [(r.seed, r.collapse_step()) for r in d if r.collapse_step() is not None]
        coll = ", ".join(f"seed {s} @ step {c}" for s, c in collapses) or ("none" if d else "—")
        rows.append([f"`{arm}`", pct([r.auc() for r in d]), pct(before), pct(after),
                     pct([a - b for a, b in zip(after, before)]), pct(best), coll,
                     budget_cell(d)])
    return _table(["arm", "AUC (mean pass@1 over training)", "pass@1 before RL", "pass@1 final",
                   "change", "best during RL",
                   f"collapse (≥{int(100 * results.COLLAPSE_DROP)} points below start)",
                   BUDGET_HEADER], rows)


def _final(r):
    return r.summary["accuracy_after"]


def _change(r):
    return r.summary["accuracy_after"] - r.summary["accuracy_before"]


def _ev_last(r):
    return r.mean_of("critic/explained_variance", last=10)


def paired_table(runs_by_arm, ref: str = "m_sao") -> str:
    """Each arm minus ``ref`` on the same seed (same warm start, same held-out prompts)."""
    rows = []
    arms = MAIN + CRITIC[1:4] + ["m_grpo_sync"] + [a for a, _ in STALENESS]
    for arm in _present(runs_by_arm, list(dict.fromkeys(arms))):
        if arm == ref:
            continue
        rows.append([f"`{arm}`",
                     *(results.points_interval(results.paired(runs_by_arm, arm, ref, f))
                       for f in (_final, _change, _ev_last))])
    return _table(["arm", f"final pass@1 − `{ref}`'s (points)", f"change during RL − `{ref}`'s (points)",
                   f"EV last 10 steps − `{ref}`'s (×100)"], rows)


def critic_table(runs_by_arm) -> str:
    rows = []
    for arm in _present(runs_by_arm, CRITIC):
        d = done(runs_by_arm[arm])
        rows.append([f"`{arm}`",
                     stat([r.mean_of("critic/explained_variance", first=10) for r in d]),
                     stat([r.mean_of("critic/explained_variance", last=10) for r in d]),
                     stat([r.mean_of("eval/explained_variance") for r in d]),
                     stat([r.mean_of("critic/grad_norm") for r in d]),
                     stat([r.mean_of("critic/value_loss", last=10) for r in d]),
                     pct([r.summary["accuracy_after"] for r in d]), budget_cell(d)])
    return _table(["arm", "EV, steps 1-10", "EV, last 10 steps",
                   "EV on the fixed held-out episodes (mean over evaluations)",
                   "critic grad norm (mean)",
                   "value loss, last 10", "pass@1 final", BUDGET_HEADER], rows)


def staleness_table(runs_by_arm) -> str:
    rows = []
    for arm, tau in STALENESS:
        if arm not in runs_by_arm:
            continue
        d = done(runs_by_arm[arm])
        lags, drops, masked = [], [], []
        for r in d:
            c = r.staleness_counts()
            lags.append(float((np.arange(c.size) * c).sum() / max(c.sum(), 1)) if c.size else None)
            b = r.summary.get("budget")                # drops incl. GRPO groups, of all generated
            n = b["generated"] if b else r.summary["trajectories"] + r.summary["dropped"]
            drops.append((b["dropped"] if b else r.summary["dropped"]) / n if n else None)
            m = (r.mean_of("actor/clip_fraction") if "grpo" in arm else
                 _sum_or_none(r.mean_of("actor/frac_masked_low"), r.mean_of("actor/frac_masked_high")))
            masked.append(m)
        hist = _add_counts([r.staleness_counts() for r in d])
        hist_s = _hist_text(hist) if hist.size else "—"
        rows.append([f"`{arm}`", tau, stat(lags), hist_s, pct(drops), pct(masked),
                     pct([r.summary["accuracy_after"] for r in d]),
                     ", ".join(str(r.collapse_step()) for r in d if r.collapse_step()) or
                     ("none" if d else "—"), budget_cell(d)])
    return _table(["arm", "τ", "mean lag (versions)", "lag histogram of trained tokens (share per lag 0,1,..)",
                   "trajectories dropped", "tokens masked (DIS) / clipped (PPO)", "pass@1 final",
                   "collapse step", BUDGET_HEADER], rows)


def _add_counts(arrays) -> np.ndarray:
    """Element-wise sum of count arrays of different lengths."""
    total = np.zeros(max((a.size for a in arrays), default=0), np.int64)
    for a in arrays:
        total[:a.size] += a
    return total


def _sum_or_none(a, b):
    return None if a is None or b is None else a + b


def _hist_text(counts) -> str:
    share = counts / max(counts.sum(), 1)
    return " / ".join(f"{100 * s:.0f}" for s in share) + " %"


def _drift(run: results.Run, env) -> dict:
    """``drift_summary`` recomputed from the run's records (the summary.json copy of a run
    may predate a fix of the measure), at the arm's recovery settings (``env``: its config)."""
    from sao.envs.drift import drift_summary
    return drift_summary(run.rl, tuple(env.drift_schedule),
                         recovery_fraction=env.drift_recovery_fraction,
                         window=env.drift_recovery_window)


def drift_table(runs_by_arm) -> str:
    rows = []
    n_sw = len(DRIFT_SWITCHES)
    for arm in _present(runs_by_arm, DRIFT):
        env = sweep.arm_config(arm, 0, []).env          # drift settings: the same for every seed
        summaries = [_drift(r, env) for r in done(runs_by_arm[arm])]
        per_switch = []
        for i in range(n_sw):
            with_level = [s for s in summaries if s["levels"][i] is not None]
            lags = [s["adaptation_lag"][i] for s in with_level if s["adaptation_lag"][i] is not None]
            parts = ([f"{stat(lags)}; recovered {len(lags)}/{len(with_level)}"] if lags else
                     [f"not recovered (0/{len(with_level)})"] if with_level else [])
            if len(with_level) < len(summaries):
                parts.append(f"nothing to recover in {len(summaries) - len(with_level)} "
                             f"of {len(summaries)} seeds (zero reward before the switch)")
            per_switch.append("; ".join(parts) or "—")
        phase_s = " / ".join(stat([s["phase_reward"].get(str(i)) for s in summaries])
                             for i in range(n_sw + 1))
        rows.append([f"`{arm}`", *per_switch, phase_s if summaries else "—",
                     budget_cell(runs_by_arm[arm])])
    return _table(["arm", *[f"adaptation lag after switch at step {s}" for s in DRIFT_SWITCHES],
                   "mean reward per phase", BUDGET_HEADER], rows)


def wallclock_table(runs_by_arm) -> tuple[str, float | None]:
    d = {a: done(runs_by_arm[a]) for a in _present(runs_by_arm, WALLCLOCK)}
    finals = [np.mean([r.summary["accuracy_after"] for r in rs]) for rs in d.values() if rs]
    if len(finals) < 2:
        return "Needs finished runs of both `m_sao` and `m_grpo_sync`.", None
    target = 0.9 * min(finals)
    rows = []
    for arm, rs in d.items():
        times = [results.time_to(r, target) for r in rs]
        reached = [t for t in times if t is not None]
        rows.append([f"`{arm}`", f"{len(reached)}/{len(rs)}", stat(reached),
                     stat([max(r.rl_clock().values()) for r in rs]), budget_cell(rs)])
    return (_table(["arm", "seeds reaching target", "RL seconds to target (resumed runs included)",
                    "RL seconds in all", BUDGET_HEADER], rows), target)


def _curve(ax, runs, key, label):
    d = done(runs) or [r for r in runs if r.rl]
    if not d:
        return
    # Held-out pass@1 by actor updates (arms with a critic warm-up line up), the rest by step.
    series = (lambda r: r.curve()) if key == "eval/accuracy" else (lambda r: r.series(key))
    steps = sorted({s for r in d for s, _ in series(r)})
    if not steps:
        return
    mat = np.full((len(d), len(steps)), np.nan)
    for i, r in enumerate(d):
        for s, v in series(r):
            mat[i, steps.index(s)] = v
    mean = np.nanmean(mat, axis=0)
    line, = ax.plot(steps, mean, label=f"{label} (n={len(d)})")
    if len(d) > 1:
        ax.fill_between(steps, np.nanmin(mat, axis=0), np.nanmax(mat, axis=0),
                        color=line.get_color(), alpha=0.15)


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no recorded runs yet", ha="center", va="center",
                transform=ax.transAxes)


def plots(runs_by_arm, out_dir: str) -> list[str]:
    """Writes the PNGs; returns their file names."""
    os.makedirs(out_dir, exist_ok=True)
    figs = {
        "repro_main.png": ([a for a in MAIN + ["m_sao_k1", "m_sao_full_critic"]], "eval/accuracy",
                           "held-out pass@1"),
        "repro_critic_ev.png": (CRITIC, "critic/explained_variance", "critic explained variance"),
        "repro_staleness.png": ([a for a, _ in STALENESS], "eval/accuracy", "held-out pass@1"),
        "repro_drift.png": (DRIFT, "rollout/reward", "batch reward (correct x style)"),
    }
    written = []
    for name, (arms, key, ylabel) in figs.items():
        fig, ax = plt.subplots(figsize=(7, 4))
        for a in _present(runs_by_arm, arms):
            _curve(ax, runs_by_arm[a], key, a)
        if name == "repro_drift.png":
            for s in DRIFT_SWITCHES:
                ax.axvline(s, color="grey", ls=":")
        ax.set_xlabel("actor updates" if key == "eval/accuracy" else "learner step")
        ax.set_ylabel(ylabel)
        _legend(ax)
        ax.set_title(f"{ylabel}: mean over finished seeds, band = min..max")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=90)
        plt.close(fig)
        written.append(name)
    fig, ax = plt.subplots(figsize=(7, 4))
    for a in _present(runs_by_arm, WALLCLOCK):
        for r in done(runs_by_arm[a]):
            pts = r.timed_evals()
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{a} seed {r.seed}")
    ax.set_xlabel("seconds since the learner started")
    ax.set_ylabel("held-out pass@1")
    _legend(ax)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "repro_wallclock.png"), dpi=90)
    plt.close(fig)
    return written + ["repro_wallclock.png"]


def sft_status(runs: str, seeds) -> str:
    """One line per seed: the shared SFT warm start done / at step N / not started."""
    out = []
    for s in seeds:
        d = sweep.sft_dir(runs, s)
        if any(os.path.exists(os.path.join(d, *p)) for p in (("sft", "result.json"),
                                                              ("result.json",))):
            out.append(f"seed {s}: done")
            continue
        step = None
        if os.path.exists(os.path.join(d, "metrics.jsonl")):
            from sao.run_metrics import read_metrics
            step = max((r["step"] for r in read_metrics(d) if r.get("phase") == "sft"), default=0)
        out.append(f"seed {s}: " + ("not started" if step is None else f"at step {step}"))
    return "SFT warm starts (one per seed, shared by its arms): " + "; ".join(out) + "."


def compute_used(runs: str, runs_by_arm) -> str:
    walls = [max(r.rl_clock().values()) for rs in runs_by_arm.values() for r in done(rs)]
    attempts = 0.0
    for rs in runs_by_arm.values():
        for r in rs:
            path = os.path.join(sweep.run_dir(runs, r.arm, r.seed), sweep.ATTEMPTS_FILE)
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    attempts += sum(a["seconds"] for a in json.load(f).get("runs", []))
    sft = []
    seeds = {f"seed{r.seed}" for rs in runs_by_arm.values() for r in rs}   # the tables' seeds only
    for seed_dir in sorted(os.listdir(os.path.join(runs, "_sft"))) if os.path.isdir(
            os.path.join(runs, "_sft")) else []:
        if seed_dir not in seeds:
            continue
        p = os.path.join(runs, "_sft", seed_dir, "sft", "result.json")
        p = p if os.path.exists(p) else os.path.join(runs, "_sft", seed_dir, "result.json")
        if os.path.exists(p):
            with open(p, encoding="utf-8") as f:
                sft.append(json.load(f)["sft/seconds"])
    return (f"{len(walls)} finished runs, RL steps {sum(walls) / 3600:.2f} h in total "
            f"(run processes incl. worker start and failed attempts: {attempts / 3600:.2f} h); "
            f"{len(sft)} SFT warm starts, {sum(sft) / 3600:.2f} h. Machine: {os.cpu_count()} CPU "
            f"cores ({platform.machine()}), no accelerator, shared with other jobs; the sweep runs "
            "at `nice -n 19`, so wall times are upper bounds and vary with the load.")


def write_report(runs: str, out: str, plots_dir: str, *, arms, seeds=None) -> None:
    """Writes ``out`` (markdown) and the PNGs under ``plots_dir`` from the runs in ``runs``
    (the committed records or a runs directory); ``seeds`` None: each arm's planned seeds."""
    runs_by_arm = results.load_all(runs, arms, seeds)
    seeds = sorted({r.seed for rs in runs_by_arm.values() for r in rs})
    written = plots(runs_by_arm, plots_dir)
    rel = os.path.relpath(plots_dir, os.path.dirname(os.path.abspath(out)))
    swept = {}
    if os.path.exists(os.path.join(runs, sweep.SWEEP_FILE)):
        with open(os.path.join(runs, sweep.SWEEP_FILE), encoding="utf-8") as f:
            swept = json.load(f)
    wc_table, target = wallclock_table(runs_by_arm)
    ev = ev_study.load(runs)
    discussion = open(DISCUSSION, encoding="utf-8").read() if os.path.exists(DISCUSSION) else ""
    n_done = sum(r.state == "done" for rs in runs_by_arm.values() for r in rs)
    parts = [
        "# Results: the paper's claims at small scale\n",
        f"Generated by `python -m experiments.repro.sweep report` from "
        f"`{os.path.relpath(runs, sweep.REPO) if runs.startswith(sweep.REPO) else runs}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} from {n_done} finished runs of "
        f"{sum(map(len, runs_by_arm.values()))} planned ({len(arms)} arms; seeds "
        f"{', '.join(map(str, seeds))}: each arm its group's, `base.seeds_of`). "
        "Do not edit by hand: the discussion lives in `experiments/repro/discussion.md`, "
        "everything else is recomputed from the runs. Means ± sample std over the finished "
        "seeds (n given); runs that have not finished are not in any mean.\n",
        "## Setup\n",
        f"Every arm: `experiments/repro/<arm>.py` (an `experiments/` file's `cpu` variant through "
        f"`experiments/repro/base.py` and `mech.py`): the `tiny` byte-level policy (0.43M "
        f"parameters) warm-started by SFT once per seed and shared by all arms of that seed (the "
        f"drift arms share a mixed-style one); reasoning-gym `basic_arithmetic`, 2-3 terms of 1-2 "
        f"digits, up to {mech.TOOL_CALLS} Python-tool calls in {mech.TOOL_CALLS + 1} turns, each "
        f"call sleeping a lognormal time (median {mech.LATENCY_S} s, σ {mech.LATENCY_SIGMA}, at "
        f"most {mech.LATENCY_MAX_S} s) and failing with probability {mech.FAILURE_RATE}; the "
        f"engine serves bf16 weights beside the f32 learner; {mech.STEPS} actor updates "
        f"({2 * mech.DRIFT_PHASE} for the drift arms) × {base.BATCH} trajectories at actor LR "
        f"{mech.ACTOR_LR} for every arm (GRPO: "
        f"{base.BATCH // 8} prompts × 8; a critic warm-up adds learner steps, charged in the "
        f"budget table); {base.WORKERS} rollout worker processes, {base.SLOTS} "
        f"episodes in flight each; staleness bound τ = {base.TAU} unless the arm varies it; "
        f"held-out pass@1 = the mean of {base.EVAL_SAMPLES} samples per prompt at temperature 1 "
        f"on {base.EVAL_PROMPTS} held-out prompts (the same in every arm of a seed), every 10 "
        "actor updates. "
        f"Overrides of this runs directory: `{swept.get('overrides', [])}`.\n",
        "```bash\n"
        "nohup nice -n 19 .venv/bin/python -m experiments.repro.sweep run --runs RUNS > RUNS/sweep.log 2>&1 &\n"
        ".venv/bin/python -m experiments.repro.sweep status --runs RUNS   # percent done, ETA\n"
        "git add experiments/repro/runs && git commit -m 'repro: finished runs'   # as they come\n"
        ".venv/bin/python -m experiments.repro.sweep report   # this file + docs/repro_*.png, from the records\n"
        ".venv/bin/python -m experiments.repro.sweep stop   --runs RUNS   # end it (never SIGSTOP it)\n"
        "```\n",
        f"Compute: {compute_used(runs, runs_by_arm)}\n",
        results.code_versions(runs, runs_by_arm) + " " + results.tool_timeouts(runs_by_arm) + "\n",
        "## Which runs exist\n", sft_status(runs, seeds) + "\n",
        status_table(runs_by_arm) + "\n",
        "Runs count only when every attempt started from a clean commit (`dirty`: not used).\n",
        "## Verdicts (pre-registered: `experiments/repro/PREREGISTRATION.md`)\n",
        "Each claim is a paired comparison per seed; the verdict is computed by the rule, "
        "never written by hand: **supported** only if the 95% Student-t interval of the mean "
        "difference excludes 0 in the claimed direction, **contradicted** if it excludes 0 "
        "the other way, otherwise **inconclusive at this n**, with the effect the design "
        "detects with 80% power at its n and paired spread (`results.mde`). A wide interval "
        "is not evidence against a claim.\n",
        verdicts.verdict_table(runs_by_arm) + "\n",
        "## Budget of every arm (trajectories, mean over finished seeds)\n",
        "Every arm gets the same actor updates and actor trajectories; a critic's warm-up "
        "steps and value pretraining are extra trajectories, charged here.\n",
        verdicts.budget_table(runs_by_arm) + "\n",
        "## Held-out pass@1 (main arms and the critic ablations)\n", main_table(runs_by_arm) + "\n",
        f"![held-out pass@1]({rel}/repro_main.png)\n",
        "### Paired against SAO\n",
        "Per seed, the arm's number minus `m_sao`'s on the same seed: both start from that seed's "
        "SFT warm start and are evaluated on the same held-out prompts, so the spread between "
        "warm starts (most of the ± above) cancels. Mean over seeds with a 95% Student-t "
        "interval; an interval that contains 0 means no difference is shown at this n. "
        + verdicts.eval_noise(runs_by_arm, "m_sao", "m_grpo") + "\n",
        paired_table(runs_by_arm) + "\n",
        "### Seeds outside the sweep\n", holdout.markdown(runs, runs_by_arm) + "\n",
        "## Value model: K = 2 vs K = 1, frozen attention vs full parameters\n",
        "Explained variance is the learner's `critic/explained_variance`: measured on each new "
        "batch *before* the critic's K steps on it (see the explained-variance study below).\n",
        critic_table(runs_by_arm) + "\n", f"![critic EV]({rel}/repro_critic_ev.png)\n",
        f"## Staleness at τ = {base.TAU}: the lag stragglers put on trained tokens\n",
        "GRPO's PPO clip takes its ratio against the engine's log-probs (docs/algorithm.md §7), "
        "so it sees the lag; DIS masks tokens two-sided.\n",
        staleness_table(runs_by_arm) + "\n", f"![staleness]({rel}/repro_staleness.png)\n",
        "## Simulated online learning (drifting reward)\n",
        f"The rewarded answer style switches at steps {DRIFT_SWITCHES}; adaptation lag = "
        "policy versions until the batch reward is back at 90% of its level before the switch "
        "(`sao.envs.drift.drift_summary`; a switch after a phase of zero reward has nothing to "
        "recover and no lag).\n",
        drift_table(runs_by_arm) + "\n", f"![drift]({rel}/repro_drift.png)\n",
        "## Time to a target accuracy: SAO asynchronous vs GRPO synchronous\n",
        (f"Target: held-out pass@1 ≥ {100 * target:.1f}% (90% of the lower of the two arms' "
         "mean final pass@1). Same fleet; GRPO synchronous is τ = 0: a barrier "
         "before every batch.\n" if target is not None else ""),
        wc_table + "\n", f"![wall clock]({rel}/repro_wallclock.png)\n",
        "## The quick start's falling explained variance\n", ev_study.markdown(ev) + "\n",
        (f"![EV study]({rel}/repro_ev_study.png)\n" if ev_study.plot(ev, plots_dir) else ""),
        "## Discussion\n", discussion,
    ]
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(parts).rstrip() + "\n")
    del written
