"""Reading the sweep's recorded runs: per run, per arm over seeds (no plotting, no markdown).

A run is ``RUNS/<arm>/seed<S>`` (``experiments.repro.sweep``; the committed
records ``experiments/repro/runs`` have the same layout); what is read:
``summary.json`` (written at the end of a finished run), ``metrics.jsonl``
(one record per RL step, held-out evaluations merged into their step's
record, ``sao.run_metrics.read_metrics``), ``attempts.json`` (each attempt's
commit). A finished run counts as ``done`` only when every attempt started
from a clean commit (``records.attempts_clean``); otherwise its state is
``dirty`` and no table uses it. Nothing is filled in for a run that has not
recorded it: missing values are None and the tables say so.

Statistics (the pre-registered rule, ``experiments/repro/PREREGISTRATION.md``):
:func:`verdict` of paired per-seed differences: a 95% Student-t interval,
**supported** if it excludes 0 in the claimed direction, **contradicted** if
it excludes 0 the other way, else **inconclusive at this n** with the
design's minimum detectable effect (:func:`mde`).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os

import numpy as np

from experiments.repro import ALL_ARMS, base, records, sweep

# A run has collapsed at the first held-out evaluation this far below its
# pass@1 before RL (absolute), and never comes back above the start.
COLLAPSE_DROP = 0.2


@functools.lru_cache(maxsize=None)
def actor_updates(arm: str) -> int:
    """The actor updates ``arm``'s config plans (``base.planned_budget``: ``mech.STEPS`` for
    the round-two arms, ``base.STEPS`` for round one's); ``base.STEPS`` for an unknown arm."""
    if arm not in {a for a, _, _ in ALL_ARMS}:
        return base.STEPS
    return base.planned_budget(sweep.arm_config(arm, 0, []))["actor_updates"]


@dataclasses.dataclass
class Run:
    """One arm x seed as recorded. ``rl``: RL-phase records by step, ``state``: sweep state."""

    arm: str
    seed: int
    state: str
    summary: dict | None
    rl: list[dict]

    def series(self, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` of a scalar metric over the RL records that have it (finite only)."""
        out = []
        for r in self.rl:
            v = r.get(key)
            if isinstance(v, (int, float)) and math.isfinite(v):
                out.append((int(r["step"]), float(v)))
        return out

    def evals(self) -> list[tuple[int, float]]:
        """Held-out pass@1 by learner step (step 0 = before RL)."""
        return self.series("eval/accuracy")

    def curve(self) -> list[tuple[int, float]]:
        """Held-out pass@1 by actor updates (the record's ``learner/policy_version``; 0 before
        RL): the x-axis on which arms with and without a critic warm-up line up."""
        out = []
        for r in self.rl:
            acc = r.get("eval/accuracy")
            if isinstance(acc, (int, float)) and math.isfinite(acc):
                v = r.get("learner/policy_version", 0 if int(r["step"]) == 0 else None)
                if v is not None:
                    out.append((int(v), float(acc)))
        return sorted(out)

    def auc(self, updates: int | None = None) -> float | None:
        """Area under the held-out learning curve over actor updates ``0..updates`` (default
        the arm's, :func:`actor_updates`), divided by ``updates``: the mean pass@1 over
        training (trapezoid rule). None unless the curve has its start (0) and end
        (``updates``) points."""
        updates = actor_updates(self.arm) if updates is None else updates
        pts = [(x, y) for x, y in self.curve() if x <= updates]
        if not pts or pts[0][0] != 0 or pts[-1][0] != updates:
            return None
        xs, ys = np.array([x for x, _ in pts], float), np.array([y for _, y in pts], float)
        return float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2) / updates)

    def rl_clock(self) -> dict[int, float]:
        """Seconds of RL steps up to and including each step: the running sum of the
        records' ``time/step_s`` (waiting for the fleet, the update, publishing, evaluation,
        checkpoints). A resumed run's redone steps count once (records merge by step), so
        unlike the process clock (``time_s``, restarted by a resume) it spans attempts."""
        clock, total = {0: 0.0}, 0.0
        for r in sorted(self.rl, key=lambda r: int(r["step"])):
            if int(r["step"]) > 0 and isinstance(r.get("time/step_s"), (int, float)):
                total += float(r["time/step_s"])
                clock[int(r["step"])] = total
        return clock

    def timed_evals(self) -> list[tuple[float, float]]:
        """``(RL seconds at the evaluation, pass@1)`` (:meth:`rl_clock`; the evaluation before
        RL at 0 s); resumed runs included."""
        clock = self.rl_clock()
        return [(clock[s], acc) for s, acc in self.evals() if s in clock]

    def mean_of(self, key: str, first: int | None = None, last: int | None = None) -> float | None:
        vals = [v for s, v in self.series(key) if s > 0]   # step 0 holds the evaluation only
        if first is not None:
            vals = vals[:first]
        if last is not None:
            vals = vals[-last:]
        return float(np.mean(vals)) if vals else None

    def staleness_counts(self) -> np.ndarray:
        """Action tokens per lag (versions), summed over RL steps."""
        total = np.zeros(0, np.int64)
        for r in self.rl:
            c = r.get("batch/staleness_counts")
            if c:
                c = np.asarray(c, np.int64)
                if c.size > total.size:
                    total = np.pad(total, (0, c.size - total.size))
                total[:c.size] += c
        return total

    def collapse_step(self) -> int | None:
        """First evaluation step where pass@1 fell ``COLLAPSE_DROP`` below the start and stayed
        below the start to the end; None if it never did."""
        ev = self.evals()
        if not ev or ev[0][0] != 0:
            return None
        start = ev[0][1]
        for i, (step, acc) in enumerate(ev[1:], 1):
            if acc < start - COLLAPSE_DROP and all(a < start for _, a in ev[i:]):
                return step
        return None


def load_run(runs: str, arm: str, seed: int) -> Run:
    """The run's recorded files (missing ones read as nothing); a finished run of a dirty
    or unrecorded commit has state ``dirty``."""
    d = sweep.run_dir(runs, arm, seed)
    summary = None
    if os.path.exists(os.path.join(d, sweep.SUMMARY_FILE)):
        with open(os.path.join(d, sweep.SUMMARY_FILE), encoding="utf-8") as f:
            summary = json.load(f)
    rl = []
    if os.path.exists(os.path.join(d, "metrics.jsonl")):
        from sao.run_metrics import read_metrics
        rl = [r for r in read_metrics(d) if r.get("phase", "rl") == "rl"]
    state = sweep.run_state(runs, arm, seed)
    if state == "done" and not records.attempts_clean(sweep._attempts(d)):
        state = "dirty"
    return Run(arm, seed, state, summary, rl)


def load_all(runs: str, arms, seeds=None) -> dict[str, list[Run]]:
    """``{arm: [Run per seed]}``: ``seeds``, or (None) each arm's planned seeds."""
    todo = sweep.plan(list(arms), None if seeds is None else list(seeds))
    return {a: [load_run(runs, a, s) for b, s in todo if b == a] for a in arms}


def done(runs_of_arm: list[Run]) -> list[Run]:
    return [r for r in runs_of_arm if r.state == "done"]


def stat(values) -> str:
    """``mean ± std (n)`` of the non-None values ('—' for none; std over seeds, ddof 1)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return "—"
    if len(vals) == 1:
        return f"{vals[0]:.3f} (n=1)"
    return f"{np.mean(vals):.3f} ± {np.std(vals, ddof=1):.3f} (n={len(vals)})"


def pct(values) -> str:
    """``stat`` in percent points."""
    vals = [100 * float(v) for v in values if v is not None]
    if not vals:
        return "—"
    if len(vals) == 1:
        return f"{vals[0]:.1f}% (n=1)"
    return f"{np.mean(vals):.1f} ± {np.std(vals, ddof=1):.1f}% (n={len(vals)})"


def time_to(run: Run, target: float) -> float | None:
    """RL seconds (:meth:`Run.rl_clock`, resumed runs included) to the first evaluation at
    or above ``target`` (None: never)."""
    for t, acc in run.timed_evals():
        if acc >= target:
            return t
    return None


def tool_timeouts(runs_by_arm) -> str:
    """Finished runs whose tool calls timed out (``rollout/tool_timeouts``, mean per episode
    over RL steps; recorded by runs since it exists)."""
    hit, recorded = [], 0
    for rs in runs_by_arm.values():
        for r in done(rs):
            m = r.mean_of("rollout/tool_timeouts")
            if m is not None:
                recorded += 1
                if m > 0:
                    hit.append(f"`{r.arm}` seed {r.seed} ({m:.3f})")
    return (f"Tool calls that hit their 5 s wall-clock limit (mean per training episode): "
            f"{', '.join(hit) or 'none'} among {recorded} finished run(s) that record it.")


def code_versions(runs: str, runs_by_arm) -> str:
    """Which commits produced the finished runs: each start's commit and the sweep's clean
    check (``attempts.json``; the records folder is data and does not count)."""
    commits, unrecorded = {}, 0
    for rs in runs_by_arm.values():
        for r in done(rs):
            path = os.path.join(sweep.run_dir(runs, r.arm, r.seed), "attempts.json")
            attempts = json.load(open(path, encoding="utf-8")).get("runs", []) \
                if os.path.exists(path) else []
            if not attempts:
                unrecorded += 1
            for c in {(a.get("commit") or "?")[:7] + ("" if a.get("clean") is True else " (not clean)")
                      for a in attempts}:
                commits[c] = commits.get(c, 0) + 1
    listed = ", ".join(f"`{c}` ({n} run{'s' if n > 1 else ''})" for c, n in sorted(commits.items()))
    return (f"Code versions (the commit of every start, `attempts.json`, clean by the sweep's "
            f"check, which ignores the records folder): {listed or 'none recorded'}; "
            f"{unrecorded} finished run(s) predate that record.")


def paired(runs_by_arm, arm: str, ref: str, value) -> list[float]:
    """``value(run of arm) - value(run of ref)`` for every seed both arms have finished.

    Arms of one seed start from the same SFT warm start and held-out prompts, so the
    per-seed difference removes the spread between warm starts (the largest part of the
    spread over seeds here). ``value``: ``Run -> float | None``; seeds where either is
    None are left out."""
    refs = {r.seed: value(r) for r in done(runs_by_arm.get(ref, []))}
    out = []
    for r in done(runs_by_arm.get(arm, [])):
        a, b = value(r), refs.get(r.seed)
        if a is not None and b is not None:
            out.append(float(a) - float(b))
    return out


def t_interval(values, level: float = 0.95) -> tuple[float, float, float] | None:
    """``(mean, low, high)``: Student-t interval of the mean at ``level`` (two-sided).

    None for fewer than 2 values (no spread to estimate). Raises ValueError if ``level``
    is not in (0, 1)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    vals = np.asarray([float(v) for v in values], np.float64)
    if vals.size < 2:
        return None
    from scipy import stats
    m = float(vals.mean())
    half = float(stats.t.ppf(0.5 + level / 2, vals.size - 1) * vals.std(ddof=1) / np.sqrt(vals.size))
    return m, m - half, m + half


def points_interval(values) -> str:
    """Differences of fractions as ``+d points [lo, hi] (n)`` (95% t interval; '—' for none)."""
    vals = [100 * float(v) for v in values]
    if not vals:
        return "—"
    if len(vals) == 1:
        return f"{vals[0]:+.1f} (n=1)"
    m, lo, hi = t_interval(vals)
    return f"{m:+.1f} [{lo:+.1f}, {hi:+.1f}] (n={len(vals)})"


def mde(sd: float, n: int, *, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """Minimum detectable effect of a paired design: the true mean difference that a
    two-sided paired t-test at ``alpha`` detects with probability ``power``, given the
    paired differences' standard deviation ``sd`` over ``n`` seeds:

        MDE = (t_{1 - alpha/2, n-1} + t_{power, n-1}) * sd / sqrt(n)

    (the usual normal-approximation formula with t quantiles for n - 1 degrees of
    freedom). None for n < 2. Raises ValueError on alpha or power outside (0, 1) or sd < 0."""
    if not (0 < alpha < 1 and 0 < power < 1) or sd < 0:
        raise ValueError(f"need 0 < alpha, power < 1 and sd >= 0, got {alpha}, {power}, {sd}")
    if n < 2:
        return None
    from scipy import stats
    return float((stats.t.ppf(1 - alpha / 2, n - 1) + stats.t.ppf(power, n - 1)) * sd / np.sqrt(n))


VERDICTS = ("supported", "contradicted", "inconclusive at this n", "not measured")


def verdict(diffs, direction: int, *, level: float = 0.95, power: float = 0.8) -> dict:
    """The pre-registered decision on paired differences (claimed arm minus reference, per
    seed). ``direction``: +1 if the claim says the difference is positive, -1 negative.

    Returns ``{"verdict", "n", "mean", "low", "high", "sd", "mde"}``: ``verdict`` one of
    ``VERDICTS`` (``not measured`` below 2 pairs), the ``level`` t interval and the MDE at
    alpha = 1 - level and ``power``. Raises ValueError unless direction is +1 or -1."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")
    vals = [float(v) for v in diffs if v is not None]
    out = {"verdict": "not measured", "n": len(vals), "mean": None, "low": None, "high": None,
           "sd": None, "mde": None}
    if len(vals) < 2:
        return out
    m, lo, hi = t_interval(vals, level)
    sd = float(np.std(vals, ddof=1))
    out.update(mean=m, low=lo, high=hi, sd=sd,       # sd 0: no spread, no MDE to speak of
               mde=mde(sd, len(vals), alpha=1 - level, power=power) if sd > 0 else None)
    if (direction > 0 and lo > 0) or (direction < 0 and hi < 0):
        out["verdict"] = "supported"
    elif (direction > 0 and hi < 0) or (direction < 0 and lo > 0):
        out["verdict"] = "contradicted"
    else:
        out["verdict"] = "inconclusive at this n"
    return out
