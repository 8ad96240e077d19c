"""One CPU-time budget per call for its whole process tree, with each
accounting this machine can prove, and the documented per-process fallback
(sao/envs/sandbox_cpu.py; docs/reliability.md, "Sandbox").

The programs do finite work (each worker stops by itself after 0.5 s of CPU),
so the limit is proven on harmless programs; each worker prints its own CPU
time every 0.05 s, which gives a measure of the tree's use that does not come
from the sandbox's accounting.
"""
import os
import re

import pytest

from sao.envs import sandbox, sandbox_cpu
from sao.envs.sandbox import SandboxLimits, ToolResult, run_python
from sao.envs.tools import render_tool_result

pytestmark = pytest.mark.skipif(
    not sandbox.sandbox_available(), reason=f"sandbox unavailable: {sandbox._probe()}")

WORKERS, WORK_S, REPORT_S = 8, 0.5, 0.05


def workers_program(workers: int, work_s: float) -> str:
    """Forks ``workers`` processes; each burns ``work_s`` of CPU, printing
    "cpu <worker> <seconds>" every REPORT_S and "done ..." at the end; the
    parent prints each one's exit status (-N: killed by signal N)."""
    return f"""
import os, sys, time
pids = []
for w in range({workers}):
    pid = os.fork()
    if pid == 0:
        last = 0.0
        while time.process_time() < {work_s}:
            if time.process_time() - last >= {REPORT_S}:
                last = time.process_time()
                os.write(1, b"cpu %d %.3f\\n" % (w, last))
        os.write(1, b"done %d %.3f\\n" % (w, time.process_time()))
        os._exit(0)
    pids.append(pid)
for pid in pids:
    _, status = os.waitpid(pid, 0)
    print("status", os.waitstatus_to_exitcode(status), flush=True)
"""


PROGRAM = workers_program(WORKERS, WORK_S)
# Past the budget: the watcher's check interval times the CPUs, plus what a
# loaded machine adds to its wake-up; and what the workers' reports miss.
SLACK_S = 0.5


def reported_cpu_s(stdout: str) -> float:
    """Sum over workers of the last CPU time each printed (a lower bound of
    the tree's use; the true use is at most WORKERS * REPORT_S more)."""
    last = {}
    for worker, seconds in re.findall(r"^(?:cpu|done) (\d+) ([\d.]+)$", stdout, re.M):
        last[worker] = float(seconds)
    return sum(last.values())


def proven_backends():
    return [a for a in sandbox_cpu.candidates() if sandbox_cpu.prove(a) is None]


@pytest.mark.parametrize("kind", ["cgroup2", "cgroup1"])
def test_processes_of_one_call_share_one_cpu_budget(kind, monkeypatch):
    acct = next((a for a in proven_backends() if a.kind == kind), None)
    if acct is None:
        pytest.skip(f"{kind} accounting not available here")
    monkeypatch.setattr(sandbox_cpu, "backend", lambda: acct)
    # Control: the same program with room for all of it runs to the end.
    free = run_python(PROGRAM, limits=SandboxLimits(timeout_s=120, cpu_s=20, max_processes=32))
    assert free.ok and free.stdout.count("done") == WORKERS, free
    assert free.cpu_time_s >= WORKERS * WORK_S
    assert reported_cpu_s(free.stdout) >= WORKERS * WORK_S
    res = run_python(PROGRAM, limits=SandboxLimits(timeout_s=120, cpu_s=1, max_processes=32))
    assert res.cpu_exceeded and res.exit_code == 128 + 9 and not res.timed_out, res
    assert not res.ok
    assert res.stdout.count("done") <= 2                 # 1 s holds at most two 0.5 s workers
    assert reported_cpu_s(res.stdout) <= 1 + SLACK_S, res.stdout
    assert 1 <= res.cpu_time_s <= 1 + SLACK_S, res
    assert "[CPU time limit exceeded]" in render_tool_result(res)


def test_per_process_fallback_stops_each_process_at_its_limit(monkeypatch):
    """Without per-call accounting only RLIMIT_CPU holds: each process is
    killed at ``cpu_s`` (SIGXCPU, or SIGKILL as soft and hard limit are
    equal), so a tree may use more in total (the documented weaker bound)."""
    monkeypatch.setattr(sandbox_cpu, "backend", lambda: None)
    assert sandbox.cpu_budget_kind() == "per-process"
    workers = 3
    program = workers_program(workers, 1.5)              # each worker wants 1.5 s
    res = run_python(program, limits=SandboxLimits(timeout_s=120, cpu_s=1, max_processes=32))
    assert res.cpu_time_s is None and not res.cpu_exceeded and not res.timed_out, res
    assert res.exit_code == 0 and res.stdout.count("done") == 0, res
    statuses = re.findall(r"^status (-?\d+)$", res.stdout, re.M)
    assert len(statuses) == workers and set(statuses) <= {"-24", "-9"}, res.stdout
    used = reported_cpu_s(res.stdout)
    assert 1 + SLACK_S < used <= workers * (1 + REPORT_S) + SLACK_S   # more than one budget


def test_this_machine_uses_a_proven_tree_budget():
    kinds = [a.kind for a in proven_backends()]
    assert sandbox.cpu_budget_kind() == (kinds[0] if kinds else "per-process")
    res = run_python("print(1)")
    assert (res.cpu_time_s is None) == (not kinds) and res.ok


MOUNTINFO_HYBRID = [("/", "/sys/fs/cgroup/cpu", "cgroup", "rw,cpu"),
                    ("/", "/sys/fs/cgroup/cpuacct", "cgroup", "rw,cpuacct"),
                    ("/", "/sys/fs/cgroup/unified", "cgroup2", "rw")]


@pytest.mark.parametrize("mounts, own, expected", [
    (MOUNTINFO_HYBRID, {"": "/", "cpu": "/", "cpuacct": "/a"},
     [("cgroup2", "/sys/fs/cgroup/unified/sao-sandbox"),
      ("cgroup1", "/sys/fs/cgroup/cpuacct/a/sao-sandbox")]),
    ([("/", "/sys/fs/cgroup", "cgroup2", "rw,nsdelegate")], {"": "/user.slice/w.scope"},
     [("cgroup2", "/sys/fs/cgroup/user.slice/w.scope/sao-sandbox")]),
    ([("/docker/x", "/sys/fs/cgroup/cpuacct", "cgroup", "rw,cpu,cpuacct")],
     {"cpu": "/docker/x/job", "cpuacct": "/docker/x/job"},
     [("cgroup1", "/sys/fs/cgroup/cpuacct/job/sao-sandbox")]),
    ([("/", "/proc", "proc", "rw")], {"": "/"}, []),
])
def test_candidates_follow_mounts_and_own_cgroup(mounts, own, expected, monkeypatch):
    monkeypatch.setattr(sandbox_cpu, "_mounts", lambda: mounts)
    monkeypatch.setattr(sandbox_cpu, "_own_paths", lambda: own)
    assert [(a.kind, a.parent) for a in sandbox_cpu.candidates()] == expected


def test_unusable_hierarchy_is_refused_with_a_reason(tmp_path):
    plain_dir = sandbox_cpu.CpuAccounting("cgroup2", str(tmp_path / "sao-sandbox"))
    reason = sandbox_cpu.prove(plain_dir)                # a plain directory is no cgroup
    assert reason is not None and reason.startswith("cgroup2")


def test_sweep_removes_only_groups_of_dead_owners():
    acct = sandbox_cpu.backend()
    if acct is None:
        pytest.skip("no per-call cgroup on this machine")
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    dead_tag = f"{dead}.{sandbox_cpu._start_time(dead)}"
    os.waitpid(dead, 0)
    assert not sandbox_cpu.owner_alive(dead_tag) and sandbox_cpu.owner_alive(
        sandbox_cpu.owner_tag())
    stale = os.path.join(acct.parent, f"{dead_tag}.0")
    os.mkdir(stale)
    live = acct.create()
    try:
        assert acct.sweep() >= 1
        assert not os.path.exists(stale) and os.path.isdir(live)
    finally:
        acct.close(live)
        if os.path.exists(stale):
            os.rmdir(stale)


def test_render_notes_an_exceeded_budget():
    res = ToolResult("partial\n", "", 137, False, False, 1.0, cpu_exceeded=True, cpu_time_s=1.01)
    assert render_tool_result(res) == "partial\n[CPU time limit exceeded] [exit status 137]"
