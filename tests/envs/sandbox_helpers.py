"""Shared by the sandbox tests: finding a sandbox's processes from outside,
and a caller process to kill or stop mid-call."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from sao.envs.sandbox_launch import UIDS


def sandbox_pids(owner: int | None = None) -> list[int]:
    """Pids of live processes (anywhere on the machine) running as one of the
    sandbox uids that process ``owner`` (default: this one) hands out."""
    uids = UIDS.uids_of(os.getpid() if owner is None else owner)
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) in uids:
                            pids.append(int(entry))
                        break
        except OSError:
            continue
    return pids


def wait_for(predicate, timeout_s: float, step_s: float = 0.02) -> float | None:
    """Seconds until ``predicate()`` held, or None if it did not within ``timeout_s``."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            return None
        time.sleep(step_s)


def start_caller(code: str, timeout_s: float, tmpdir: str) -> subprocess.Popen:
    """A separate Python process calling ``run_python(code, timeout_s=...)``,
    with its own TMPDIR (so any temp dir it makes is found there); it prints
    the result's ``timed_out`` and ``exit_code`` to its stdout (a pipe)."""
    script = ("from sao.envs.sandbox import run_python\n"
              f"res = run_python({code!r}, timeout_s={timeout_s!r})\n"
              "print(res.timed_out, res.exit_code)\n")
    env = dict(os.environ, TMPDIR=tmpdir)
    return subprocess.Popen([sys.executable, "-c", script], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
