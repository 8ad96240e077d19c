"""The reproduction sweep's driver: every arm x seed at the same budget, resumable.

    python -m experiments.repro.sweep run    --runs /work/repro-runs [--arms sao,grpo] [--seeds 0,1,2]
    python -m experiments.repro.sweep status --runs /work/repro-runs
    python -m experiments.repro.sweep report --runs /work/repro-runs   # RESULTS.md + docs/repro_*.png
    python -m experiments.repro.sweep stop   --runs /work/repro-runs   # end the running driver

``run`` goes seed by seed (so that one seed's comparison is complete before
the next starts): it trains the seed's SFT warm start once in
``RUNS/_sft/seedS`` (``sao.train.sft_warm_start``, the code path of every
run) and copies it into each arm's run directory ``RUNS/<arm>/seedS`` before
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

from experiments.repro import ARM_NAMES, MECH_ARM_NAMES, base

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWEEP_FILE = "sweep.json"
SUMMARY_FILE = "summary.json"
ATTEMPTS_FILE = "attempts.json"
LOCK_FILE = "sweep.lock"     # one ``run`` per runs directory at a time (flock)
_child: subprocess.Popen | None = None     # the run or SFT process in progress
_sft_arm = "sao"                           # --sft_arm: the SFT every arm here shares
_stopping = False                          # set by SIGTERM: end the child, start nothing new


def _on_stop(signum, frame) -> None:
    global _stopping
    _stopping = True
    if _child is not None and _child.poll() is None:
        _child.terminate()


def run_dir(runs: str, arm: str, seed: int) -> str:
    """``RUNS/<arm>/seed<seed>``: the run directory of one arm and seed."""
    return os.path.join(runs, arm, f"seed{seed}")


def sft_dir(runs: str, seed: int) -> str:
    """``RUNS/_sft/seed<seed>``: where the seed's shared SFT warm start is trained."""
    return os.path.join(runs, "_sft", f"seed{seed}")


def arm_config(arm: str, seed: int, overrides: list[str]):
    """The locked config of ``arm`` at ``seed`` with ``key=value`` overrides."""
    from sao.analysis import experiment_config      # heavy (JAX): only where a config is built
    return experiment_config(os.path.join(REPO, "experiments", "repro", f"{arm}.py:{seed}"),
                             overrides)


def run_state(runs: str, arm: str, seed: int) -> str:
    """``done`` (summary.json), ``failed`` (gave up), ``partial`` (started) or ``pending``."""
    d = run_dir(runs, arm, seed)
    if os.path.exists(os.path.join(d, SUMMARY_FILE)):
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
                     sft_arm: str = "sao") -> None:
    """Raises ValueError unless every arm's SFT inputs (``base.SFT_KEYS`` and the SFT task's
    generator settings) equal the ``sao`` arm's, so one SFT per seed serves all arms."""
    def key(cfg):
        return json.dumps({**{k: cfg[k].to_dict() for k in base.SFT_KEYS},
                           "task": cfg.env.task_config[cfg.sft.task].to_dict()},
                          sort_keys=True, default=str)
    ref = key(arm_config(sft_arm, seed, overrides))
    for arm in arms:
        if key(arm_config(arm, seed, overrides)) != ref:
            raise ValueError(f"arm {arm!r} warm-starts differently from {sft_arm!r}: it cannot "
                             "share the seed's SFT (run it in its own --runs with --sft_arm)")


def train_sft(runs: str, seed: int, overrides: list[str], sft_arm: str = "sao") -> None:
    """Trains (or finds) the seed's SFT warm start in ``sft_dir`` with ``sft_arm``'s config."""
    from sao import components, run_metrics, train
    from sao.learner.mesh import mesh_from_config
    cfg = arm_config(sft_arm, seed, overrides)
    d = sft_dir(runs, seed)
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


def ensure_sft(runs: str, seed: int, overrides: list[str], sft_arm: str = "sao") -> bool:
    """The seed's SFT (in a child process, as the runs are); True when it exists."""
    d = sft_dir(runs, seed)
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
    if not os.path.exists(os.path.join(d, "sft")):
        shutil.copytree(os.path.join(sft_dir(runs, seed), "sft"), os.path.join(d, "sft"))
    attempts = _attempts(d)
    # One fixed held-out episode set per seed for every critic (sao.value_eval): the first
    # arm of the seed that scores a critic samples it next to the seed's SFT, the others reuse it.
    value_set = os.path.join(sft_dir(runs, seed), "value_heldout.bin")
    cmd = _python_cmd("-m", "sao.main", f"--config=experiments/repro/{arm}.py:{seed}",
                      f"--workdir={d}", f"--config.eval.value_episodes_file={value_set}",
                      *(f"--config.{o}" for o in overrides))
    t0 = time.monotonic()
    rc = _run_logged(cmd, os.path.join(d, "driver.log"))
    attempts.setdefault("runs", []).append({"rc": rc, "seconds": round(time.monotonic() - t0, 1),
                                            "ended": time.strftime("%Y-%m-%d %H:%M:%S"),
                                            "stopped": _stopping})
    failures = sum(r["rc"] != 0 and not r.get("stopped") for r in attempts["runs"])
    if rc != 0 and not _stopping and failures >= max_attempts:
        attempts["gave_up"] = True
    _write_json(os.path.join(d, ATTEMPTS_FILE), attempts)
    return run_state(runs, arm, seed)


def run(runs: str, arms: list[str], seeds: list[int], overrides: list[str], *,
        max_attempts: int = 2) -> dict:
    """Every arm x seed, seed-major; returns ``{(arm, seed): state}``."""
    runs = os.path.abspath(runs)
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
        return _run_locked(runs, arms, seeds, overrides, max_attempts)
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


def _run_locked(runs, arms, seeds, overrides, max_attempts) -> dict:
    states = {}
    for seed in seeds:
        check_shared_sft(arms, seed, overrides, _sft_arm)
        if _stopping:
            break
        if not ensure_sft(runs, seed, overrides, _sft_arm) and not _stopping:
            print(f"seed {seed}: SFT failed (see {sft_dir(runs, seed)}/driver.log)", flush=True)
            states.update({(a, seed): run_state(runs, a, seed) for a in arms})
            continue
        for arm in arms:
            if _stopping:
                break
            states[(arm, seed)] = run_one(runs, arm, seed, overrides, max_attempts=max_attempts)
            print(f"{time.strftime('%H:%M:%S')} {arm} seed {seed}: {states[(arm, seed)]}", flush=True)
    if _stopping:
        print(f"{time.strftime('%H:%M:%S')} stopped (SIGTERM)", flush=True)
    return states


def status(runs: str, arms: list[str], seeds: list[int]) -> str:
    """A plain-text table of each arm x seed's state (and RL steps recorded)."""
    lines = [f"{'arm':20s} " + " ".join(f"{'seed ' + str(s):>16s}" for s in seeds)]
    for arm in arms:
        cells = []
        for s in seeds:
            st = run_state(runs, arm, s)
            cells.append(f"{st}{'' if st in ('done', 'pending') else f' @{rl_steps_done(runs, arm, s)}'}")
        lines.append(f"{arm:20s} " + " ".join(f"{c:>16s}" for c in cells))
    secs = [sum(r["seconds"] for r in _attempts(run_dir(runs, a, s)).get("runs", []))
            for a in arms for s in seeds if run_state(runs, a, s) == "done"]
    left = sum(run_state(runs, a, s) in ("pending", "partial") for a in arms for s in seeds)
    if secs:
        mean = sum(secs) / len(secs)
        lines.append(f"{len(secs)} runs done, {mean / 60:.0f} min each on average (at this "
                     f"load); {left} to go: about {left * mean / 3600:.1f} h more")
    else:
        lines.append(f"no run done yet; {left} to go")
    return "\n".join(lines)


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.repro.sweep",
                                description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("run", "status", "report", "sft", "stop"))
    p.add_argument("--runs", required=True, help="runs directory (outside the repository)")
    p.add_argument("--arms", default=",".join(ARM_NAMES), help="comma-separated arms")
    p.add_argument("--seeds", default=",".join(map(str, base.SEEDS)))
    p.add_argument("--seed", type=int, default=0, help="sft: the seed")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every arm (repeatable)")
    p.add_argument("--max_attempts", type=int, default=2)
    p.add_argument("--sft_arm", default="sao", help="the arm whose SFT settings every arm of the "
                   "runs directory shares (e.g. m_drift_sao for the mixed-style drift warm start)")
    p.add_argument("--out", default=os.path.join(REPO, "RESULTS.md"), help="report: markdown file")
    p.add_argument("--plots", default=os.path.join(REPO, "docs"), help="report: PNG directory")
    args = p.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    known = ARM_NAMES + MECH_ARM_NAMES
    unknown = sorted(set(arms + [args.sft_arm]) - set(known))
    if unknown:
        p.error(f"unknown arms {unknown}; known: {', '.join(known)}")
    bad = [o for o in args.set if "=" not in o]
    if bad:
        p.error(f"--set takes KEY=VALUE, got {bad}")
    return args, arms, [int(s) for s in args.seeds.split(",") if s]


def main(argv=None) -> int:
    args, arms, seeds = _parse(sys.argv[1:] if argv is None else argv)
    global _sft_arm
    _sft_arm = args.sft_arm
    if args.command == "sft":
        train_sft(os.path.abspath(args.runs), args.seed, args.set, args.sft_arm)
    elif args.command == "run":
        states = run(args.runs, arms, seeds, args.set, max_attempts=args.max_attempts)
        print(status(os.path.abspath(args.runs), arms, seeds))
        return 0 if all(s == "done" for s in states.values()) else 1
    elif args.command == "status":
        print(status(os.path.abspath(args.runs), arms, seeds))
    elif args.command == "stop":
        print(stop(args.runs))
    else:
        from experiments.repro import report
        report.write_report(os.path.abspath(args.runs), args.out, args.plots, arms=arms,
                            seeds=seeds)
        print(f"wrote {args.out} and plots under {args.plots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
