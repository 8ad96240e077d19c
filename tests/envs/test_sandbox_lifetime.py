"""A sandboxed call never outlives its caller or its own wall clock, and leaves
nothing on the host (docs/reliability.md, "Sandbox").

Each test runs the call in a separate caller process, then kills (SIGKILL) or
stops (SIGSTOP) that caller while the program runs: a program that sleeps 120 s
after starting a ``sleep 120`` in a new session (outside its process group).
"""
import os
import signal
import subprocess
import sys

import pytest
from sandbox_helpers import sandbox_pids, start_caller, wait_for

from sao.envs import sandbox, sandbox_cpu

pytestmark = pytest.mark.skipif(
    not sandbox.sandbox_available(), reason=f"sandbox unavailable: {sandbox._probe()}")

PROGRAM = ("import subprocess, time\n"
           "subprocess.Popen(['sleep', '120'], start_new_session=True)\n"
           "time.sleep(120)\n")
# Both far beyond what the kill needs, far below the program's own 120 s.
GONE_WITHIN_S = 5.0
START_WITHIN_S = 60.0


def running_sleep(owner: int) -> bool:
    """The program of ``owner``'s call runs (its ``sleep`` child exists)."""
    for pid in sandbox_pids(owner):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "sleep":
                    return True
        except OSError:
            pass
    return False


def groups_of(owner: int) -> list[str]:
    acct = sandbox_cpu.backend()
    if acct is None:
        return []
    return [n for n in os.listdir(acct.parent) if n.startswith(f"{owner}.")]


@pytest.fixture
def killed_caller(tmp_path):
    """A caller SIGKILLed mid-call: ``(pid, seconds until its sandbox was gone
    or None, its TMPDIR)``."""
    caller = start_caller(PROGRAM, timeout_s=60.0, tmpdir=str(tmp_path))
    try:
        assert wait_for(lambda: running_sleep(caller.pid), START_WITHIN_S) is not None
        assert len(sandbox_pids(caller.pid)) >= 2          # the program and its sleep
        caller.kill()
        caller.wait()
        gone = wait_for(lambda: not sandbox_pids(caller.pid), GONE_WITHIN_S)
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()
    return caller.pid, gone, tmp_path


def test_program_dies_with_its_killed_caller(killed_caller):
    pid, gone_after_s, tmpdir = killed_caller
    assert gone_after_s is not None, f"still running: {sandbox_pids(pid)}"
    assert gone_after_s < GONE_WITHIN_S
    assert os.listdir(tmpdir) == []                      # no temp dir left on the host


def test_killed_callers_group_is_removed_by_the_next_process(killed_caller):
    pid, gone_after_s, _ = killed_caller
    assert gone_after_s is not None
    if sandbox_cpu.backend() is None:
        pytest.skip("no per-call cgroup on this machine (per-process CPU limit only)")
    assert wait_for(lambda: len(groups_of(pid)) == 1, 2.0) is not None   # left behind
    fresh = subprocess.run(
        [sys.executable, "-c", "from sao.envs import sandbox; assert sandbox.sandbox_available()"],
        timeout=120, check=False)
    assert fresh.returncode == 0
    assert groups_of(pid) == []


def test_wall_clock_holds_while_the_caller_is_stopped(tmp_path):
    timeout_s = 3.0
    caller = start_caller(PROGRAM, timeout_s=timeout_s, tmpdir=str(tmp_path))
    try:
        assert wait_for(lambda: running_sleep(caller.pid), START_WITHIN_S) is not None
        os.kill(caller.pid, signal.SIGSTOP)
        # The caller cannot act; the sandbox's own clock ends the call.
        gone = wait_for(lambda: not sandbox_pids(caller.pid), timeout_s + GONE_WITHIN_S)
        assert gone is not None, f"still running: {sandbox_pids(caller.pid)}"
        os.kill(caller.pid, signal.SIGCONT)
        out, _ = caller.communicate(timeout=60)
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()
    assert out == "True None\n"              # resumed late, the caller reports a timeout
    assert os.listdir(tmp_path) == [] and groups_of(caller.pid) == []
