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

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
        cmd = " ".join(shlex.quote(a) for a in self.argv)
        return f"{env} {cmd}".strip() + (" &" if self.background else "")


def sao_main(config: str, workdir: str, role: str, *, python: str = "python",
             overrides: Sequence[str] = (), extra: Sequence[str] = ()) -> tuple[str, ...]:
    """argv of ``python -m sao.main`` for one role; raises ValueError on an unknown role."""
    if role not in ("all", "learner", "rollout"):
        raise ValueError(f"role must be all|learner|rollout, got {role!r}")
    argv = [python, "-m", "sao.main", f"--config={config}", f"--workdir={workdir}", f"--role={role}"]
    argv += [o if o.startswith("--") else f"--config.{o}" for o in overrides]
    return tuple(argv) + tuple(extra)


def print_steps(steps: Sequence[Step], out=None) -> None:
    out = out or sys.stdout
    for s in steps:
        print(f"[{s.where}] {s.shell()}", file=out)


def dry_run_or_run(steps: Sequence[Step], dry_run: bool) -> int:
    """``--dry-run``: prints the steps and returns 0; otherwise runs them (``run_steps``)."""
    if dry_run:
        print_steps(steps)
        return 0
    return run_steps(steps)


def run_steps(steps: Sequence[Step]) -> int:
    """Runs steps in order; background steps are started and waited for at the end.

    Returns the first non-zero exit status (0 if all succeed); background
    processes are terminated when a foreground step fails.
    """
    background: list[subprocess.Popen] = []
    status = 0
    try:
        for s in steps:
            env = {**os.environ, **dict(s.env)}
            if s.background:
                background.append(subprocess.Popen(list(s.argv), env=env))
                continue
            status = subprocess.call(list(s.argv), env=env)
            if status:
                return status
        for p in background:
            status = status or p.wait()
        return status
    finally:
        for p in background:
            if p.poll() is None:
                p.terminate()


def add_common_flags(parser) -> None:
    parser.add_argument("--config", required=True, help="experiments/<file>.py[:variant]")
    parser.add_argument("--workdir", required=True, help="run directory (local path or gs://)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, e.g. --set run.steps=10 (repeatable)")
