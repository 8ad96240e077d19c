"""Shared pieces of the launchers: the ``sao.main`` command line and dry-run / run.

Every launcher builds a list of :class:`Step` (a shell command and where it
runs) and either prints them (``--dry-run``: exactly what would run, one per
line, prefixed by ``[where]``) or runs them in order (local ones as
subprocesses; remote ones through the command itself, e.g. ``gcloud ... ssh``).
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import subprocess
import sys
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class Step:
    """One command. ``where`` names the machine(s); ``background`` keeps it running."""

    where: str
    argv: tuple[str, ...]
    background: bool = False
    env: tuple[tuple[str, str], ...] = ()
    at_exit: "Step | None" = None   # run at the end once this step ran (stop what it started, delete what it made)

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
        cmd = " ".join(shlex.quote(a) for a in self.argv)
        return f"{env} {cmd}".strip() + (" &" if self.background else "")


def expandable(word: str) -> str:
    """``word`` as one double-quoted shell word: ``$VAR`` still expands (``"$HOME/sao"``),
    while ``"``, ``\\`` and backquotes are escaped (``shlex.quote`` would stop the expansion)."""
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'


def sao_main(config: str, workdir: str, role: str, *, python: str = "python",
             overrides: Sequence[str] = (), extra: Sequence[str] = ()) -> tuple[str, ...]:
    """argv of ``python -m sao.main`` for one role; raises ValueError on an unknown role."""
    if role not in ("all", "learner", "rollout"):
        raise ValueError(f"role must be all|learner|rollout, got {role!r}")
    argv = [python, "-m", "sao.main", f"--config={config}", f"--workdir={workdir}", f"--role={role}"]
    argv += [o if o.startswith("--") else f"--config.{o}" for o in overrides]
    return tuple(argv) + tuple(extra)


def check_config(args) -> None:
    """Loads ``--config`` with its ``--set`` overrides as ``sao.main`` will and checks it
    (``sao.config_checks``, paths on other machines not looked up), so that a typo fails
    here, on ``--dry-run`` too, not on the cluster. Raises SystemExit with the reason."""
    from absl import flags

    from sao import config_checks
    from sao.analysis import experiment_config
    try:
        config_checks.check(experiment_config(args.config, args.set), local_paths=False)
    except (ValueError, KeyError, AttributeError, FileNotFoundError, flags.Error) as e:
        raise SystemExit(f"--config {args.config} {' '.join(args.set)}: {e}") from None


def print_steps(steps: Sequence[Step], out=None) -> None:
    """One line per step, then the ``at_exit`` steps as ``[where, at exit]`` in the order they run."""
    out = out or sys.stdout
    for s in steps:
        print(f"[{s.where}] {s.shell()}", file=out)
    for s in reversed([s.at_exit for s in steps if s.at_exit]):
        print(f"[{s.where}, at exit] {s.shell()}", file=out)


class Terminated(Exception):
    """SIGTERM / SIGHUP reached a launcher: what it started is stopped on the way out."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.status = 128 + signum


_exiting = [False]


def _raise_terminated(signum, _frame):
    if not _exiting[0]:  # the way out (stopping, at-exit steps) is not interrupted again
        raise Terminated(signum)


def print_locations(workdir: str, out=None) -> None:
    """Where the run's records go (docs/multihost.md, "Where files go"), for the launch's log."""
    w = workdir.rstrip("/")
    print(f"SAO run {w}: metrics {w}/metrics.jsonl, TensorBoard {w}/tb, checkpoints {w}/ckpt, "
          f"summary {w}/summary.json, worker and server logs {w}/workers (local work dirs)",
          file=out or sys.stderr, flush=True)


def dry_run_or_run(steps: Sequence[Step], dry_run: bool, *, stop_background: bool = False) -> int:
    """``--dry-run``: prints the steps and returns 0; otherwise runs them (``run_steps``)."""
    if dry_run:
        print_steps(steps)
        return 0
    return run_steps(steps, stop_background=stop_background)


def run_steps(steps: Sequence[Step], *, stop_background: bool = False,
              stop_timeout_s: float = 60.0) -> int:
    """Runs steps in order; background steps are started and, at the end, waited
    for, or with ``stop_background`` (servers, once the foreground job is done)
    stopped: SIGTERM, SIGKILL after ``stop_timeout_s``. Then, whatever happened,
    the ``at_exit`` step of every step that ran, last first (stop a remote fleet,
    delete a TPU VM); their failures are printed, not returned.

    Returns the first non-zero exit status (0 if all succeed; a background
    step stopped this way does not count; ``128 + signal`` when SIGTERM or
    SIGHUP ended this process); background processes are stopped the same way
    when a foreground step fails or this one is interrupted.
    """
    background: list[subprocess.Popen] = []   # and the foreground step while it runs
    at_exit: list[Step] = []
    status = 0
    previous = {sig: signal.signal(sig, _raise_terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        for s in steps:
            env = {**os.environ, **dict(s.env)}
            if s.background:
                background.append(subprocess.Popen(list(s.argv), env=env))
            else:
                proc = subprocess.Popen(list(s.argv), env=env)
                background.append(proc)
                status = proc.wait()
                status = 128 - status if status < 0 else status  # killed: 128 + signal, as a shell says
                background.remove(proc)
            if s.at_exit and not status:
                at_exit.append(s.at_exit)
            if status:
                return status
        if not stop_background:
            for p in background:
                status = status or p.wait()
        return status
    except Terminated as e:
        status = e.status
        return status
    finally:
        _exiting[0] = True
        stop_processes(background, stop_timeout_s)
        for s in reversed(at_exit):
            code = subprocess.call(list(s.argv), env={**os.environ, **dict(s.env)})
            if code:
                print(f"at exit: {s.shell()} failed ({code})", file=sys.stderr)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _exiting[0] = False


def stop_processes(procs: Sequence[subprocess.Popen], timeout_s: float) -> None:
    """SIGTERM to each running process, SIGKILL to those still running after ``timeout_s``."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def add_common_flags(parser) -> None:
    parser.add_argument("--config", required=True, help="experiments/<file>.py[:variant]")
    parser.add_argument("--workdir", required=True, help="run directory (local path or gs://)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, e.g. --set run.steps=10 (repeatable)")
