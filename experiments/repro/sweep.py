"""The reproduction sweep's driver: every arm x seed at the same budget, resumable.

    python -m experiments.repro.sweep run    --runs /work/repro-runs [--arms m_sao,m_grpo] [--seeds 0,1,2]
    python -m experiments.repro.sweep status --runs /work/repro-runs   # percent done, ETA
    python -m experiments.repro.sweep report          # RESULTS.md + docs/repro_*.png from the records
    python -m experiments.repro.sweep stop   --runs /work/repro-runs   # end the running driver

``run`` refuses a tree with uncommitted changes (``experiments.repro.records``;
``--allow_dirty`` runs anyway, for development: such runs are never recorded
nor reported) and writes each attempt's commit into ``attempts.json``. A
finished run's small files are copied into the committed records folder
``experiments/repro/runs/<arm>/seed<S>/`` (``--records``); a run found there
is done, on any machine, so a new checkout's ``run`` continues where the
sweep stopped (commit the records as they come) and ``report`` needs only
the repository. Without ``--seeds`` each arm runs the seeds of its group
(``base.seeds_of``).

``run`` goes seed by seed (so that one seed's comparison is complete before
the next starts): it trains the seed's SFT warm start once in
``RUNS/_sft/seedS`` (``sao.train.sft_warm_start``, the code path of every
run; arms with a warm start of their own, ``experiments.repro.SFT_OF`` such
as the drift arms', share ``RUNS/_sft_<arm>/seedS``) and copies it into each
arm's run directory ``RUNS/<arm>/seedS`` before
starting ``python -m sao.main --config=experiments/repro/<arm>.py:S
--workdir=RUNS/<arm>/seedS``, which then loads it instead of training again
(``sao.sft.cached_sft``). A run with ``summary.json`` is finished and skipped;
any other run directory is resumed by the same command (``sao.train`` resumes
from its last checkpoint). A run that fails is retried on the next ``run``
until it has failed ``--max_attempts`` times. Each run's console goes to
``RUNS/<arm>/seedS/driver.log``. One ``run`` at a time per runs directory: a
second one is refused while the first lives (``RUNS/sweep.lock`` holds its pid).

``--set key=value`` (repeatable) overrides config fields of every arm and of
the SFT (``--set run.steps=2``); the overrides are recorded in
``RUNS/sweep.json`` on the first ``run`` and a later ``run`` with other
overrides is refused, so one runs directory never mixes budgets.

Start it at low priority so that it only takes idle CPU:
``nohup nice -n 19 python -m experiments.repro.sweep run --runs DIR > DIR/sweep.log 2>&1 &``.
``stop`` (or SIGTERM to the driver) ends the run in progress (SIGTERM: it
resumes from its last checkpoint; the episodes in flight are dropped) without
counting it as a failed attempt, and the driver exits. Never pause a sweep
(SIGSTOP) to free the machine: tool calls have wall-clock limits, so every
call in flight would come back ``[timed out]`` and train on a zero reward.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from experiments.repro import (ALL_ARMS, ARM_NAMES, DEFAULT_SFT, base, records as rec,
                               sft_arm_of)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWEEP_FILE = "sweep.json"
SUMMARY_FILE = "summary.json"
ATTEMPTS_FILE = "attempts.json"
LOCK_FILE = "sweep.lock"     # one ``run`` per runs directory at a time (flock)
_child: subprocess.Popen | None = None     # the run or SFT process in progress
_stopping = False                          # set by SIGTERM: end the child, start nothing new


def _on_stop(signum, frame) -> None:
    global _stopping
    _stopping = True
    if _child is not None and _child.poll() is None:
        _child.terminate()


def run_dir(runs: str, arm: str, seed: int) -> str:
    """``RUNS/<arm>/seed<seed>``: the run directory of one arm and seed."""
    return os.path.join(runs, arm, f"seed{seed}")


def sft_name(sft_arm: str = DEFAULT_SFT) -> str:
    """``_sft`` (the ``DEFAULT_SFT`` warm start) or ``_sft_<sft_arm>``: the folder name of a
    warm start's runs (and records)."""
    return "_sft" if sft_arm == DEFAULT_SFT else f"_sft_{sft_arm}"


def sft_dir(runs: str, seed: int, sft_arm: str = DEFAULT_SFT) -> str:
    """``RUNS/<sft_name>/seed<seed>``: where the seed's SFT warm start trained by ``sft_arm``'s
    config (``experiments.repro.sft_arm_of``) is trained, shared by the arms of that seed."""
    return os.path.join(runs, sft_name(sft_arm), f"seed{seed}")


def arm_config(arm: str, seed: int, overrides: list[str]):
    """The locked config of ``arm`` at ``seed`` with ``key=value`` overrides (``run.steps=N``
    is N actor updates, as ``base.STEPS``: see `arm_overrides`)."""
    from sao.analysis import experiment_config      # heavy (JAX): only where a config is built
    return experiment_config(os.path.join(REPO, "experiments", "repro", f"{arm}.py:{seed}"),
                             arm_overrides(arm, seed, overrides))


def arm_overrides(arm: str, seed: int, overrides: list[str]) -> list[str]:
    """``overrides`` with ``run.steps=N`` read as N actor updates: the arm's critic warm-up
    steps are added (``base.planned_budget``), so every arm keeps equal actor updates."""
    steps = [o for o in overrides if o.split("=", 1)[0] == "run.steps"]
    if not steps:
        return list(overrides)
    from sao.analysis import experiment_config
    rest = [o for o in overrides if o not in steps]
    c = experiment_config(os.path.join(REPO, "experiments", "repro", f"{arm}.py:{seed}"), rest)
    warm = base.planned_budget(c)["critic_only_steps"]
    return rest + [f"run.steps={int(steps[-1].split('=', 1)[1]) + warm}"]


def run_state(runs: str, arm: str, seed: int, records: str | None = None) -> str:
    """``done`` (summary.json here or in ``records``), ``failed`` (gave up), ``partial``
    (started) or ``pending``."""
    d = run_dir(runs, arm, seed)
    if os.path.exists(os.path.join(d, SUMMARY_FILE)) or (
            records is not None and rec.is_recorded(records, arm, seed)):
        return "done"
    if not os.path.isdir(d):
        return "pending"
    return "failed" if _attempts(d).get("gave_up") else "partial"


def rl_steps_done(runs: str, arm: str, seed: int) -> int:
    """Highest RL step recorded in the run's metrics.jsonl (0 if none)."""
    path = os.path.join(run_dir(runs, arm, seed), "metrics.jsonl")
    best = 0
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if rec.get("phase") == "rl" and "learner/step" in rec:
                    best = max(best, int(rec["step"]))
    return best


def _attempts(d: str) -> dict:
    path = os.path.join(d, ATTEMPTS_FILE)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def check_sweep_file(runs: str, overrides: list[str]) -> None:
    """Records ``overrides`` in ``RUNS/sweep.json`` or checks them against it; raises ValueError."""
    path = os.path.join(runs, SWEEP_FILE)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            recorded = json.load(f)["overrides"]
        if recorded != list(overrides):
            raise ValueError(f"{runs} was run with --set {recorded}, not {list(overrides)}: "
                             "use another --runs directory")
        return
    os.makedirs(runs, exist_ok=True)
    _write_json(path, {"overrides": list(overrides), "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                       "steps": base.STEPS, "batch": base.BATCH})


def check_shared_sft(arms: list[str], seed: int, overrides: list[str],
                     sft_arm: str = DEFAULT_SFT) -> None:
    """Raises ValueError unless every arm's SFT inputs (``base.SFT_KEYS`` and the SFT task's
    generator settings) equal ``sft_arm``'s, so one SFT per seed serves all these arms."""
    def key(cfg):
        return json.dumps({**{k: cfg[k].to_dict() for k in base.SFT_KEYS},
                           "task": cfg.env.task_config[cfg.sft.task].to_dict()},
                          sort_keys=True, default=str)
    ref = key(arm_config(sft_arm, seed, overrides))
    for arm in arms:
        if key(arm_config(arm, seed, overrides)) != ref:
            raise ValueError(f"arm {arm!r} warm-starts differently from {sft_arm!r}: it cannot "
                             "share its SFT (give it its own in experiments.repro.SFT_OF)")


def train_sft(runs: str, seed: int, overrides: list[str], sft_arm: str = DEFAULT_SFT) -> None:
    """Trains (or finds) the seed's SFT warm start in ``sft_dir`` with ``sft_arm``'s config."""
    from sao import components, run_metrics, train
    from sao.learner.mesh import mesh_from_config
    cfg = arm_config(sft_arm, seed, overrides)
    d = sft_dir(runs, seed, sft_arm)
    os.makedirs(d, exist_ok=True)
    with run_metrics.MetricsWriter(d, tensorboard=False) as writer:
        policy = components.make_policy(cfg, cfg.seed, mesh=mesh_from_config(cfg.model.mesh))
        train.sft_warm_start(cfg, policy, components.make_tokenizer(cfg), d, writer, print)


def _python_cmd(*args: str) -> list[str]:
    return [sys.executable, *args]


def _run_logged(cmd: list[str], log_path: str) -> int:
    global _child
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n### {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        log.flush()
        _child = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        if _stopping:                                    # SIGTERM came before the child existed
            _child.terminate()
        try:
            return _child.wait()
        finally:
            _child = None


def ensure_sft(runs: str, seed: int, overrides: list[str], sft_arm: str = DEFAULT_SFT) -> bool:
    """The seed's SFT of ``sft_arm`` (in a child process, as the runs are); True when it exists."""
    d = sft_dir(runs, seed, sft_arm)
    if os.path.exists(os.path.join(d, "sft", "result.json")):
        return True
    os.makedirs(d, exist_ok=True)
    rc = _run_logged(_python_cmd("-m", "experiments.repro.sweep", "sft", "--runs", runs,
                                 "--seed", str(seed), "--sft_arm", sft_arm,
                                 *sum((["--set", o] for o in overrides), [])),
                     os.path.join(d, "driver.log"))
    return rc == 0 and os.path.exists(os.path.join(d, "sft", "result.json"))


def run_one(runs: str, arm: str, seed: int, overrides: list[str], *, max_attempts: int) -> str:
    """Runs or resumes one arm x seed; returns its state afterwards."""
    state = run_state(runs, arm, seed)
    if state in ("done", "failed"):
        return state
    d = run_dir(runs, arm, seed)
    os.makedirs(d, exist_ok=True)
    shared = sft_dir(runs, seed, sft_arm_of(arm))
    if not os.path.exists(os.path.join(d, "sft")):
        shutil.copytree(os.path.join(shared, "sft"), os.path.join(d, "sft"))
    attempts = _attempts(d)
    # One fixed held-out episode set per seed and warm start for every critic (sao.value_eval):
    # the first arm that scores a critic samples it next to the SFT, the others reuse it.
    value_set = os.path.join(shared, "value_heldout.bin")
    cmd = _python_cmd("-m", "sao.main", f"--config=experiments/repro/{arm}.py:{seed}",
                      f"--workdir={d}", f"--config.eval.value_episodes_file={value_set}",
                      *(f"--config.{o}" for o in arm_overrides(arm, seed, overrides)))
    git = rec.git_state(REPO)
    t0 = time.monotonic()
    rc = _run_logged(cmd, os.path.join(d, "driver.log"))
    attempts.setdefault("runs", []).append({"rc": rc, "seconds": round(time.monotonic() - t0, 1),
                                            "ended": time.strftime("%Y-%m-%d %H:%M:%S"),
                                            "stopped": _stopping, "commit": git["commit"],
                                            "clean": git["clean"]})
    failures = sum(r["rc"] != 0 and not r.get("stopped") for r in attempts["runs"])
    if rc != 0 and not _stopping and failures >= max_attempts:
        attempts["gave_up"] = True
    _write_json(os.path.join(d, ATTEMPTS_FILE), attempts)
    return run_state(runs, arm, seed)


def run(runs: str, arms: list[str], seeds: list[int] | None, overrides: list[str], *,
        max_attempts: int = 2, records: str | None = rec.RECORDS,
        allow_dirty: bool = False) -> dict:
    """Every arm x seed (``seeds`` None: each arm's ``base.seeds_of``), seed-major, skipping
    runs finished here or in ``records``; returns ``{(arm, seed): state}``. Raises
    RuntimeError on a dirty tree (unless ``allow_dirty``) or a sweep already running."""
    runs = os.path.abspath(runs)
    if not allow_dirty:
        rec.require_clean(REPO)
    if records == rec.RECORDS and overrides:
        raise ValueError("--set changes the pre-registered budget: such runs cannot go into "
                         "the committed records folder (pass --records DIR or --records '')")
    check_sweep_file(runs, overrides)
    lock = open(os.path.join(runs, LOCK_FILE), "a+")     # held until this process ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        raise RuntimeError(f"another sweep is running on {runs} (pid {lock.read().strip()})"
                           ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    previous = signal.signal(signal.SIGTERM, _on_stop)
    try:
        return _run_locked(runs, arms, seeds, overrides, max_attempts, records)
    finally:
        signal.signal(signal.SIGTERM, previous)
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def stop(runs: str, timeout_s: float = 300.0) -> str:
    """Ends the ``run`` driver of ``runs`` (SIGTERM; see the module docstring) and waits
    until it has let go of the lock; returns what happened."""
    path = os.path.join(os.path.abspath(runs), LOCK_FILE)
    if not os.path.exists(path):
        return "no sweep has run here"
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return "no sweep is running"
        except BlockingIOError:
            lock.seek(0)
            pid = int(lock.read().strip())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return f"stopped the sweep (pid {pid})"
            except BlockingIOError:
                time.sleep(0.5)
    raise TimeoutError(f"the sweep (pid {pid}) still holds {path} after {timeout_s:.0f} s")


def plan(arms: list[str], seeds: list[int] | None) -> list[tuple[str, int]]:
    """``(arm, seed)`` in run order, seed-major: ``seeds`` for every arm, or (None) each
    arm's ``base.seeds_of`` its comparison group."""
    group = {a: g for a, g, _ in ALL_ARMS}
    every = sorted({s for a in arms for s in (seeds if seeds is not None
                                              else base.seeds_of(group[a]))})
    return [(a, s) for s in every for a in arms
            if s in (seeds if seeds is not None else base.seeds_of(group[a]))]


def _run_locked(runs, arms, seeds, overrides, max_attempts, records) -> dict:
    states = {}
    todo = plan(arms, seeds)
    for seed in sorted({s for _, s in todo}):
        arms_s = [a for a, s in todo if s == seed]
        for arm in arms_s:                               # finished (here or recorded)
            if run_state(runs, arm, seed, records) == "done":
                if records is not None and not rec.is_recorded(records, arm, seed):
                    rec.record_run(run_dir(runs, arm, seed), rec.record_dir(records, arm, seed))
                states[(arm, seed)] = "done"
        arms_s = [a for a in arms_s if (a, seed) not in states]
        for sft_arm in dict.fromkeys(sft_arm_of(a) for a in arms_s):   # in run order
            if _stopping:
                break
            _run_seed(runs, seed, sft_arm, [a for a in arms_s if sft_arm_of(a) == sft_arm],
                      overrides, max_attempts, records, states)
    if _stopping:
        print(f"{time.strftime('%H:%M:%S')} stopped (SIGTERM)", flush=True)
    return states


def _run_seed(runs, seed, sft_arm, arms_s, overrides, max_attempts, records, states) -> None:
    """The arms ``arms_s`` of one seed that share ``sft_arm``'s warm start: SFT, then each."""
    check_shared_sft(arms_s, seed, overrides, sft_arm)
    if not ensure_sft(runs, seed, overrides, sft_arm):
        if not _stopping:
            print(f"seed {seed}: SFT failed (see {sft_dir(runs, seed, sft_arm)}/driver.log)",
                  flush=True)
        states.update({(a, seed): run_state(runs, a, seed) for a in arms_s})
        return
    if records is not None:
        rec.record_sft(sft_dir(runs, seed, sft_arm), records, seed, sft_name(sft_arm))
    for arm in arms_s:
        if _stopping:
            break
        states[(arm, seed)] = run_one(runs, arm, seed, overrides, max_attempts=max_attempts)
        if states[(arm, seed)] == "done" and records is not None:
            rec.record_run(run_dir(runs, arm, seed), rec.record_dir(records, arm, seed))
        print(f"{time.strftime('%H:%M:%S')} {arm} seed {seed}: {states[(arm, seed)]}", flush=True)


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.repro.sweep",
                                description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("run", "status", "report", "sft", "stop"))
    p.add_argument("--runs", default="", help="runs directory (outside the repository); "
                   "report: default the records folder")
    p.add_argument("--records", default=rec.RECORDS,
                   help="committed records of finished runs ('' = none)")
    p.add_argument("--allow_dirty", action="store_true",
                   help="run from uncommitted code (development: never recorded nor reported)")
    p.add_argument("--arms", default=",".join(ARM_NAMES), help="comma-separated arms")
    p.add_argument("--seeds", default="", help="comma-separated (default: each arm's "
                   "base.seeds_of its group)")
    p.add_argument("--seed", type=int, default=0, help="sft: the seed")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every arm (repeatable); run.steps=N is N actor updates")
    p.add_argument("--max_attempts", type=int, default=2)
    p.add_argument("--sft_arm", default=DEFAULT_SFT, help="sft: the arm whose config trains "
                   "the warm start (experiments.repro.sft_arm_of)")
    p.add_argument("--out", default=os.path.join(REPO, "RESULTS.md"), help="report: markdown file")
    p.add_argument("--plots", default=os.path.join(REPO, "docs"), help="report: PNG directory")
    args = p.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    known = [a for a, _, _ in ALL_ARMS]
    unknown = sorted(set(arms + [args.sft_arm]) - set(known))
    if unknown:
        p.error(f"unknown arms {unknown}; known: {', '.join(known)}")
    bad = [o for o in args.set if "=" not in o]
    if bad:
        p.error(f"--set takes KEY=VALUE, got {bad}")
    if args.command != "report" and not args.runs:
        p.error(f"{args.command} needs --runs")
    seeds = [int(s) for s in args.seeds.split(",") if s] or None
    return args, arms, seeds


def main(argv=None) -> int:
    from experiments.repro import progress
    args, arms, seeds = _parse(sys.argv[1:] if argv is None else argv)
    records = args.records or None
    if args.command == "sft":
        train_sft(os.path.abspath(args.runs), args.seed, args.set, args.sft_arm)
    elif args.command == "run":
        states = run(args.runs, arms, seeds, args.set, max_attempts=args.max_attempts,
                     records=records, allow_dirty=args.allow_dirty)
        print(progress.status(os.path.abspath(args.runs), arms, seeds, overrides=args.set,
                              records=records))
        return 0 if all(s == "done" for s in states.values()) else 1
    elif args.command == "status":
        print(progress.status(os.path.abspath(args.runs), arms, seeds, overrides=args.set,
                              records=records))
    elif args.command == "stop":
        print(stop(args.runs))
    else:
        from experiments.repro import report
        source = os.path.abspath(args.runs or records or rec.RECORDS)
        report.write_report(source, args.out, args.plots, arms=arms, seeds=seeds)
        print(f"wrote {args.out} and plots under {args.plots} from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
