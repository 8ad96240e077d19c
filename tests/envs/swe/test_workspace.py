"""The sandboxed working copy: state across commands, per-call time and
output limits (proven on harmless programs), no network."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from sao.envs.swe.workspace import REPO_DIR, ExecLimits, Workspace, execute_files


def test_commands_see_and_change_the_copy(sandbox):
    ws = Workspace({"pkg/m.py": b"x = 1\n", "old.txt": b"bye\n"}, ExecLimits(timeout_s=20))
    out = ws.execute("pwd; cat pkg/m.py; echo 'x = 2' > pkg/m.py; rm old.txt; mkdir -p d; "
                     "echo hi > d/new.txt; mkdir __pycache__; echo c > __pycache__/a.pyc")
    assert out == {"returncode": 0, "output": f"{REPO_DIR}\nx = 1\n"}
    assert ws.files == {"pkg/m.py": b"x = 2\n", "d/new.txt": b"hi\n"}
    # State persists into the next call; cwd is relative to the root.
    assert ws.execute("cat m.py && exit 3", cwd="pkg") == {"returncode": 3, "output": "x = 2\n"}
    # The venv's python and pytest are on PATH.
    res = ws.run("python -c 'import pytest, sys; print(sys.version_info[0])'")
    assert (res.returncode, res.output) == (0, "3\n")


def test_timeout_proven_on_a_harmless_sleep(sandbox):
    ws = Workspace({"a.txt": b"a\n"}, ExecLimits(timeout_s=30))
    start = time.monotonic()
    res = ws.run("echo before > a.txt; sleep 30", timeout=1.5)
    took = time.monotonic() - start
    assert res.timed_out and res.returncode is None and took < 15
    assert ws.files == {"a.txt": b"before\n"}   # changes up to the timeout are kept
    out = ws.execute("sleep 30", timeout=1)
    assert out["returncode"] == -1 and "[timed out after 1 s]" in out["output"]


def test_output_cap_proven_on_harmless_output(sandbox):
    ws = Workspace({}, ExecLimits(timeout_s=20, max_output_bytes=1000))
    res = ws.run("head -c 5000 /dev/zero | tr '\\0' x; echo; echo done >&2")
    assert res.truncated and res.returncode == 0 and len(res.output) == 1000
    assert set(res.output) == {"x"}


def test_endless_output_is_cut_and_stopped(sandbox):
    # Runs only after the two proofs above: endless output under both limits.
    ws = Workspace({}, ExecLimits(timeout_s=20, max_output_bytes=2000))
    res = ws.run("yes", timeout=2)
    assert res.truncated and res.timed_out and len(res.output) == 2000


def test_too_large_changes_are_discarded(sandbox):
    ws = Workspace({"keep.txt": b"k\n"}, ExecLimits(timeout_s=20, max_change_mb=1))
    res = ws.run("head -c 2000000 /dev/zero > big.bin; echo x > keep.txt")
    assert "changes discarded" in res.error
    assert ws.files == {"keep.txt": b"k\n"}


def test_no_network(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def serve():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not stop.is_set():
            try:
                conn, _ = server.accept()
                accepted.append(conn)
            except OSError:
                continue

    stop = threading.Event()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        control = socket.create_connection(("127.0.0.1", port), timeout=5)   # reachable from here
        control.close()
        time.sleep(0.5)
        seen = len(accepted)
        code = ("import socket\nfor host in ('127.0.0.1', '8.8.8.8'):\n"
                "    try:\n"
                f"        socket.create_connection((host, {port}), timeout=2); print('connected')\n"
                "    except OSError as e: print('refused', type(e).__name__)\n")
        res, _ = execute_files({"c.py": code.encode()}, "python c.py",
                               limits=ExecLimits(timeout_s=20))
        assert res.output.count("refused") == 2 and "connected" not in res.output
        time.sleep(0.5)
        assert len(accepted) == seen == 1
    finally:
        stop.set()
        thread.join()
        server.close()
        for conn in accepted:
            conn.close()


def test_limits_validate():
    with pytest.raises(ValueError):
        ExecLimits(timeout_s=0)
    with pytest.raises(ValueError):
        ExecLimits(max_output_bytes=1.5)
    with pytest.raises(TypeError):
        execute_files({}, ["ls"])
