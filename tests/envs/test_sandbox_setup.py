"""The sandbox must really run where the suite runs, from any checkout path.

The hostile-code proofs in test_sandbox.py skip when the machine forbids
namespaces; this file makes such a skip an explicit choice
(``SAO_ALLOW_NO_SANDBOX=1``) instead of a silent pass, and checks the case that
once hid the interpreter: a virtual environment living under /tmp (which the
sandbox replaces with its own private /tmp), and how the host's own mounts
look inside (a separate world-writable mount, sockets in /run).
"""
import os
import subprocess
import sys
import tempfile

import pytest

from sao.envs import sandbox, sandbox_launch


def test_sandbox_available_or_explicitly_waived():
    if os.environ.get("SAO_ALLOW_NO_SANDBOX") == "1":
        pytest.skip("SAO_ALLOW_NO_SANDBOX=1: sandbox proofs waived on this machine")
    assert sandbox.sandbox_available(), sandbox._probe()


@pytest.mark.skipif(not sandbox.sandbox_available(), reason="sandbox unavailable")
def test_interpreter_in_a_venv_under_tmp(tmp_path):
    assert str(tmp_path).startswith("/tmp/")
    venv = tmp_path / "clone" / ".venv"
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    (tmp_path / "secret.txt").write_text("host /tmp file")
    code = ("import os, sys; print(sys.prefix); print(os.path.exists(%r)); "
            "print(sorted(os.listdir('.')), os.getcwd()); open(sys.prefix + '/x', 'w')"
            % str(tmp_path / "secret.txt"))
    result = sandbox.run_python(code, timeout_s=20, python=str(venv / "bin" / "python"))
    lines = result.stdout.splitlines()
    # The venv runs from its read-only mount outside the working directory;
    # the rest of the host /tmp is hidden and the program sees only its files.
    assert lines[:3] == [sandbox_launch.KEPT_MOUNT, "False", "['main.py'] /tmp"], result
    assert result.exit_code != 0 and "Errno" in result.stderr  # the kept venv is read-only


@pytest.mark.skipif(not sandbox.sandbox_available(), reason="sandbox unavailable")
def test_host_unix_socket_in_run_is_hidden():
    import socket
    import uuid
    path = f"/run/sao-test-{uuid.uuid4().hex[:8]}.sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(path)
        os.chmod(path, 0o666)
        server.listen(1)
        server.settimeout(0.5)
        code = ("import socket; s = socket.socket(socket.AF_UNIX)\n"
                f"try:\n    s.connect({path!r}); print('connected')\n"
                "except OSError as e:\n    print('refused', e.errno)\n")
        result = sandbox.run_python(code, timeout_s=20)
        assert result.stdout.startswith("refused"), result
        with pytest.raises(socket.timeout):
            server.accept()
        # Control: the same socket is reachable from outside the sandbox.
        client = socket.socket(socket.AF_UNIX)
        client.connect(path)
        client.close()
    finally:
        server.close()
        if os.path.exists(path):
            os.unlink(path)


@pytest.fixture
def world_writable_mount():
    """A tmpfs mounted on a fresh directory outside /tmp, mode 1777 (a separate
    mount, as a data disk or a bind mount would be); needs root."""
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    path = tempfile.mkdtemp(prefix="sao-test-mount-", dir="/mnt" if os.path.isdir("/mnt") else "/")
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", path],
                       check=True, capture_output=True)
        try:
            yield path
        finally:
            subprocess.run(["umount", path], check=True)
    finally:
        os.rmdir(path)


@pytest.mark.skipif(not sandbox.sandbox_available(), reason="sandbox unavailable")
def test_separate_mounts_are_read_only_inside(world_writable_mount):
    target = os.path.join(world_writable_mount, "evil")
    open(os.path.join(world_writable_mount, "probe"), "w").close()  # control: writable outside
    code = ("import os, subprocess\n"
            f"print(os.path.exists({world_writable_mount + '/probe'!r}))\n"
            f"try:\n    open({target!r}, 'w').write('x')\n    print('WROTE')\n"
            "except OSError as e:\n    print('blocked', e.errno)\n"
            # Device nodes on the read-only /dev still work.
            "open('/dev/null', 'w').write('x')\n"
            "print(len(open('/dev/urandom', 'rb').read(4)))\n"
            "print(subprocess.run(['true'], stdout=subprocess.DEVNULL).returncode)\n")
    res = sandbox.run_python(code, timeout_s=20)
    assert res.stdout.split("\n")[:2] == ["True", "blocked 30"], res    # 30 = EROFS
    assert res.ok and res.stdout.split("\n")[2:4] == ["4", "0"], res
    assert not os.path.exists(target)
