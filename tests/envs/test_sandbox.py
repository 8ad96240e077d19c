"""Proofs of the sandbox guarantees with hostile programs (docs/envs.md).

The process limit is proven on a harmless program first (module fixture
``nproc_proven``); the fork-bomb test depends on it.
"""
import asyncio
import os
import signal
import socket
import threading
import time

import pytest
from sandbox_helpers import sandbox_pids

from sao.envs import sandbox
from sao.envs.sandbox import SandboxLimits, run_python, run_python_async
from sao.envs.sandbox_launch import UIDS

pytestmark = pytest.mark.skipif(
    not sandbox.sandbox_available(), reason=f"sandbox unavailable: {sandbox._probe()}")

# The uids this test process hands out (other processes' sandboxes use other blocks).
OUR_UIDS = UIDS.uids_of(os.getpid())


def assert_no_leftovers():
    deadline = time.monotonic() + 5.0
    while sandbox_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_pids() == []


@pytest.fixture(scope="module")
def nproc_proven():
    """RLIMIT_NPROC holds: with max_processes=N, a program can start N-1 sleeps
    (it is one task itself) and the N-th fails."""
    n = 6
    code = (
        "import subprocess\n"
        "procs = []\n"
        f"for i in range({n} + 1):\n"
        "    try:\n"
        "        procs.append(subprocess.Popen(['sleep', '30']))\n"
        "    except OSError as e:\n"
        "        print('failed', i, type(e).__name__)\n"
        "        break\n"
        "print('started', len(procs))\n"
        "for p in procs: p.kill(); p.wait()\n")
    res = run_python(code, limits=SandboxLimits(timeout_s=20, max_processes=n))
    assert res.exit_code == 0, res
    assert f"started {n - 1}" in res.stdout, res
    assert "BlockingIOError" in res.stdout, res
    assert_no_leftovers()
    return True


def test_runs_code_and_reports_exit_status():
    res = run_python("import sys\nprint(6 * 7)\nprint('warn', file=sys.stderr)\nsys.exit(3)")
    assert res.stdout == "42\n" and res.stderr == "warn\n"
    assert res.exit_code == 3 and not res.timed_out and not res.truncated and not res.ok
    ok = run_python("print(input()[::-1])", stdin="abc", files={"data/x.txt": "hi"})
    assert ok.ok and ok.stdout == "cba\n"
    files = run_python("print(open('data/x.txt').read())", files={"data/x.txt": "hi"})
    assert files.stdout == "hi\n"
    big = run_python("import sys\nprint(len(sys.stdin.read()))", stdin="x" * 300_000)
    assert big.ok and big.stdout == "300000\n"            # larger than a pipe buffer
    deaf = run_python("print('no read')", stdin="y" * 300_000)
    assert deaf.ok and deaf.stdout == "no read\n"        # a program ignoring stdin


def test_runs_as_unprivileged_uid_in_fresh_namespaces():
    res = run_python("import os\nprint(os.getuid(), os.getgid(), os.getgroups(), os.getpid())\n"
                     "print(sorted(os.listdir('.')), os.getcwd())")
    uid, gid, _, _ = res.stdout.split("\n")[0].split(" ", 3)
    assert int(uid) in OUR_UIDS and int(gid) == int(uid)
    assert "[] " in res.stdout.split("\n")[0]            # no supplementary groups
    assert res.stdout.split("\n")[1] == "['main.py'] /tmp"


def test_bad_arguments_raise():
    with pytest.raises(TypeError):
        run_python(b"print(1)")
    with pytest.raises(ValueError):
        run_python("print(1)", files={"../escape.py": "x"})
    with pytest.raises(ValueError):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError):
        SandboxLimits(memory_mb=-1)
    # Fractions or bools would reach prlimit / mount and fail the sandbox's
    # own setup (reported as the program's exit status), so they are refused.
    for bad in ({"memory_mb": 0.5}, {"disk_mb": 1.5}, {"max_processes": True},
                {"cpu_s": 0.5}, {"timeout_s": float("nan")}, {"max_output_bytes": "9"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SandboxLimits(**bad)
    for name in ("main.py", "./main.py", "sub/../main.py"):
        with pytest.raises(ValueError, match="main.py"):
            run_python("print(1)", files={name: "print(2)"})


def test_cannot_read_root_only_file(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    os.chmod(secret, 0o600)
    os.chmod(tmp_path, 0o755)              # even a traversable directory does not help
    paths = [str(secret), f"/proc/1/root{secret}", "/proc/1/environ"]
    code = "import sys\nfor p in sys.argv[1:] or %r:\n" % (paths,) + (
        "    try:\n"
        "        print('READ', p, open(p).read()[:20])\n"
        "    except OSError as e:\n"
        "        print('blocked', p, type(e).__name__)\n")
    res = run_python(code)
    assert res.exit_code == 0, res
    assert "TOPSECRET" not in res.stdout and "READ" not in res.stdout, res.stdout
    assert res.stdout.count("blocked") == len(paths)


def test_cannot_write_outside_its_directory(tmp_path):
    os.chmod(tmp_path, 0o777)               # world-writable on the host: still hidden
    targets = [str(tmp_path / "evil"), "/evil", "/var/tmp/evil", "/dev/shm/evil",
               "/run/lock/evil", os.path.join(os.getcwd(), "evil")]
    code = "for p in %r:\n" % (targets,) + (
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "        print('WROTE', p)\n"
        "    except OSError as e:\n"
        "        print('blocked', p, type(e).__name__)\n"
        "open('inside.txt', 'w').write('ok')\n"
        "print('inside ok')\n")
    res = run_python(code)
    assert "WROTE" not in res.stdout, res.stdout
    assert res.stdout.count("blocked") == len(targets) and "inside ok" in res.stdout
    for p in targets:
        assert not os.path.exists(p), p


def test_file_size_and_disk_limits():
    res = run_python(
        "try:\n    open('big', 'wb').write(b'0' * (3 << 20))\nexcept OSError as e:\n"
        "    print('fsize', type(e).__name__)\n"
        "try:\n    [open(f'f{i}', 'wb').write(b'0' * (1 << 20)) for i in range(8)]\n"
        "except OSError as e:\n    print('disk', e.errno)\n",
        limits=SandboxLimits(max_file_mb=2, disk_mb=4))
    assert "fsize" in res.stdout and "disk 28" in res.stdout, res   # 28 = ENOSPC


def test_socket_connect_to_loopback_server_fails():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted = []
    server.settimeout(0.2)

    def accept_loop(stop):
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                accepted.append(conn)
            except OSError:
                pass

    stop = threading.Event()
    thread = threading.Thread(target=accept_loop, args=(stop,), daemon=True)
    thread.start()
    try:
        # Control: the server is reachable from outside the sandbox.
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        deadline = time.monotonic() + 2
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(accepted) == 1
        res = run_python(
            "import socket\n"
            "for host in ('127.0.0.1', 'localhost', '8.8.8.8'):\n"
            "    try:\n"
            f"        socket.create_connection((host, {port}), timeout=2)\n"
            "        print('CONNECTED', host)\n"
            "    except OSError as e:\n"
            "        print('blocked', host, e.errno)\n")
        assert "CONNECTED" not in res.stdout and res.stdout.count("blocked") == 3, res
        time.sleep(0.3)
        assert len(accepted) == 1
    finally:
        stop.set()
        thread.join()
        for c in accepted:
            c.close()
        server.close()


def test_fork_bomb_is_contained(nproc_proven):
    assert nproc_proven
    res = run_python("import os\nwhile True:\n    try:\n        os.fork()\n"
                     "    except OSError:\n        pass\n",
                     limits=SandboxLimits(timeout_s=2, max_processes=16))
    # Ended by whichever limit comes first: the wall clock (under load) or the CPU
    # budget of the whole tree (2 CPU s; 16 spinning processes reach it in ~1 s idle).
    assert (res.timed_out and res.exit_code is None) or (res.cpu_exceeded and res.exit_code == 137), res
    assert res.duration_s < 30.0
    assert_no_leftovers()
    assert run_python("print('alive')").stdout == "alive\n"


def test_background_processes_die_with_the_run(nproc_proven):
    res = run_python("import subprocess\nsubprocess.Popen(['sleep', '60'], start_new_session=True)\n"
                     "print('left a child')")
    assert res.exit_code == 0 and "left a child" in res.stdout
    assert_no_leftovers()


def test_memory_bomb_is_contained():
    res = run_python("x = []\nwhile True:\n    x.append(bytearray(50 << 20))\n",
                     limits=SandboxLimits(timeout_s=10, memory_mb=256))
    assert not res.timed_out and res.exit_code != 0
    assert "MemoryError" in res.stderr, res


def test_infinite_loop_times_out():
    res = run_python("while True:\n    pass\n", timeout_s=1.0)
    assert res.timed_out and res.exit_code is None and 1.0 <= res.duration_s < 30.0
    assert_no_leftovers()


def test_program_that_closes_its_output_still_times_out():
    res = run_python("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(100)\n", timeout_s=1.0)
    assert res.timed_out and res.exit_code is None
    assert_no_leftovers()


def test_cpu_limit_kills_busy_program():
    res = run_python("while True:\n    pass\n",
                     limits=SandboxLimits(timeout_s=20, cpu_s=1))
    assert not res.timed_out and res.exit_code in (128 + 24, 128 + 9), res   # SIGXCPU / SIGKILL


def test_huge_output_is_capped():
    res = run_python("while True:\n    print('x' * 1000)\n",
                     limits=SandboxLimits(timeout_s=10, max_output_bytes=5000))
    assert res.truncated and not res.timed_out and res.exit_code is None
    assert 0 < len(res.stdout) <= 5000
    assert_no_leftovers()


def _waiting(pid: int) -> bool:
    """The program noted its start (it ignores SIGUSR2 from then on) and waits for SIGWINCH."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) >> (signal.SIGUSR2 - 1) & 1)
    except OSError:
        pass
    return False


def test_concurrent_async_runs_overlap_with_distinct_uids():
    # The overlap is built, not hoped for (a 1 s sleep did not overlap four starts spread
    # by a loaded machine): each program notes its start, marks itself ready by ignoring
    # SIGUSR2, and waits for SIGWINCH, sent once all four are ready. SIGWINCH is blocked
    # first (its default action is to ignore), so an early one is kept, never fatal.
    code = ("import os, signal, time\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGWINCH})\n"
            "t0 = time.time()\n"
            "signal.signal(signal.SIGUSR2, signal.SIG_IGN)\n"
            "got = signal.sigtimedwait({signal.SIGWINCH}, 120)\n"
            "print(os.getuid(), t0, time.time(), got is not None)")

    seen_running = []

    async def watch(runs):
        deadline = time.monotonic() + 120
        while not runs.done():                  # positive control for sandbox_pids()
            pids = sandbox_pids()
            seen_running.append(len(pids))
            waiting = [p for p in pids if _waiting(p)]
            if len(waiting) >= 4 or time.monotonic() > deadline:
                for p in waiting:
                    try:
                        os.kill(p, signal.SIGWINCH)
                    except ProcessLookupError:
                        pass
            await asyncio.sleep(0.05)

    async def many():
        runs = asyncio.gather(*(run_python_async(code, timeout_s=150) for _ in range(4)))
        await watch(runs)
        return await runs

    results = asyncio.run(many())
    assert max(seen_running) >= 4             # the scan sees live sandboxed programs
    rows = [r.stdout.split() for r in results]
    assert all(r.ok for r in results), results
    uids = {int(r[0]) for r in rows}
    starts, ends = [float(r[1]) for r in rows], [float(r[2]) for r in rows]
    assert len(uids) == 4
    assert max(starts) < min(ends)          # all four were running at once
    assert all(r[3] == "True" for r in rows), rows   # released, not timed out
    assert_no_leftovers()
