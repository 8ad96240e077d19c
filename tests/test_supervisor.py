"""sao.supervisor: children die with a SIGKILLed parent; dead children come back with backoff."""
import logging
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from sao import supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def gone(pid: int) -> bool:
    """No such process, or only its zombie (a container's init may not reap orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_for(pred, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_child_dies_with_its_sigkilled_parent(tmp_path):
    out = tmp_path / "child.out"
    parent_code = textwrap.dedent(f"""
        import os, sys, time
        from sao.supervisor import Supervisor
        child = ("from sao.supervisor import die_with_parent; import os, time; "
                 "armed = die_with_parent(); "
                 "print(os.getpid(), armed, os.environ.get('SAO_PARENT_PID'), flush=True); "
                 "time.sleep(120)")
        Supervisor(os.environ).add([sys.executable, "-c", child], {str(out)!r})
        time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        assert wait_for(lambda: out.exists() and out.read_text().strip(), 60)
        pid, armed, env_left = out.read_text().split()
        assert armed == "True" and env_left == "None"  # armed; not handed to its own children
        parent.kill()                                  # SIGKILL: no cleanup code runs
        parent.wait()
        t0 = time.monotonic()
        assert wait_for(lambda: gone(int(pid)), 5), "the child outlived its killed parent"
        assert time.monotonic() - t0 < 5
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_child_whose_parent_is_already_gone_exits():
    env = {**os.environ, supervisor.PARENT_PID_ENV: "1"}  # not our parent: it died before we armed
    code = "from sao.supervisor import die_with_parent; die_with_parent(); print('ran on')"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1 and "ran on" not in p.stdout
    # Without the variable nothing happens.
    assert supervisor.die_with_parent() is False


def test_supervisor_restarts_a_dead_child_with_growing_backoff_then_stops_all(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=supervisor.__name__)
    sup = supervisor.Supervisor(os.environ, initial_backoff_s=0.3, max_backoff_s=0.6, poll_s=0.02)
    sup.add(SLEEPER, str(tmp_path / "c0.log"))
    sup.add(SLEEPER, str(tmp_path / "c1.log"))
    sup.watch()
    try:
        gaps = []
        for n in (1, 2, 3):
            old = sup.proc(0)
            old.kill()
            old.wait()
            t0 = time.monotonic()
            assert wait_for(lambda: sup.restarts()[0] == n, 10)
            gaps.append(time.monotonic() - t0)
            assert sup.proc(0).pid != old.pid and sup.proc(0).poll() is None
        # Doubled, then capped: the waits it chose (the gaps' order alone raced a loaded machine).
        waits = [float(m) for m in re.findall(r"restarting in ([\d.]+) s", caplog.text)]
        assert waits == [0.3, 0.6, 0.6] and all(g >= w for g, w in zip(gaps, waits))
        assert sup.restarts() == [3, 0]
    finally:
        procs = [sup.proc(0), sup.proc(1)]
        sup.stop(timeout_s=5)
    assert all(p.poll() is not None for p in procs)
    time.sleep(0.5)
    assert sup.restarts() == [3, 0] and all(p.poll() is not None for p in (sup.proc(0), sup.proc(1)))


def test_supervisor_settings_are_checked():
    with pytest.raises(ValueError):
        supervisor.Supervisor({}, initial_backoff_s=0)
    with pytest.raises(ValueError):
        supervisor.Supervisor({}, initial_backoff_s=2, max_backoff_s=1)
