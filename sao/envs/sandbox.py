"""Sandboxed execution of untrusted Python (the agent's tool).

Each call runs the code in a fresh process tree, isolated with Linux
namespaces and util-linux tools (``unshare``, ``prlimit``, ``setpriv``):

* **network**: a new network namespace with no configured interface, so every
  connect (loopback included) fails with ``ENETUNREACH``;
* **processes**: a new PID namespace; the program runs as a per-call
  unprivileged uid (root is exempt from ``RLIMIT_NPROC``; an unprivileged
  uid is not), so the process limit holds; when the namespace's init exits or
  is killed every process in it dies, so nothing outlives the call;
* **files**: a new mount namespace in which ``/`` is read-only, the working
  directory is a fresh size-limited tmpfs mounted on ``/tmp`` (hiding the
  host's ``/tmp``), and the other world-writable places (``/var/tmp``,
  ``/dev/shm``, ``/dev/mqueue``) and ``/run`` (where host services keep
  their Unix sockets, e.g. ``docker.sock``, dbus) are empty read-only tmpfs;
  a pathname Unix socket elsewhere on the file system stays reachable if its
  mode lets any user write to it;
  files readable only by root stay unreadable (uid drop);
* **resources**: ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``, ``RLIMIT_FSIZE``,
  ``RLIMIT_NPROC``, ``RLIMIT_NOFILE``, no core dumps, plus a wall-clock
  timeout after which the whole process group is killed;
* **output**: stdout and stderr are read up to ``max_output_bytes`` each; a
  program writing more is killed and the result marked ``truncated``.

The isolation needs root (or CAP_SYS_ADMIN) to create the namespaces;
``sandbox_available()`` says whether this machine allows it, and
``run_python`` raises ``SandboxUnavailableError`` rather than ever running
code unsandboxed. The guarantees are proven by tests/envs/test_sandbox.py
(see docs/envs.md).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Mapping

# Runs as root inside the new namespaces, as their init (PID 1): builds the
# mount view, then runs the program under limits as the sandbox uid and waits
# for it (keeping PID 1 out of the program, since PID 1 ignores signals
# without handlers). Positional args: src uid nproc as_bytes cpu_s fsize_bytes
# nofile disk_mb python keep. ``keep`` (may be empty) is a host directory under
# /tmp (the interpreter's environment when it lives there, e.g. a clone in
# /tmp), mounted read-only at /run/sao-python (``python`` is then the path
# inside it; see _python_inside). /var/tmp, /dev/shm, /run and /dev/mqueue get
# small tmpfs mounts made read-only once that mount point exists.
_INIT_SCRIPT = r"""
set -e
src=$1 uid=$2 nproc=$3 as=$4 cpu=$5 fsize=$6 nofile=$7 disk=$8 py=$9 keep=${10}
mount -n --make-rprivate /
mount -n --rbind / /
mount -n -o remount,bind,ro /
mount -n -t proc -o nosuid,nodev,noexec proc /proc
if [ -d /run ]; then mount -n -t tmpfs -o size=4k,mode=0755 tmpfs /run; fi
if [ -n "$keep" ]; then
  mkdir /run/sao-python
  mount -n --rbind "$keep" /run/sao-python
  mount -n -o remount,bind,ro /run/sao-python
fi
mount -n -t tmpfs -o size=${disk}m,mode=0700,uid=$uid,gid=$uid,nosuid,nodev tmpfs /var/tmp
cp -R "$src"/. /var/tmp/
chown -R "$uid:$uid" /var/tmp
mount -n --move /var/tmp /tmp
for d in /var/tmp /dev/shm /dev/mqueue; do
  if [ -d "$d" ]; then mount -n -t tmpfs -o ro,size=4k,mode=0755 tmpfs "$d"; fi
done
if [ -d /run ]; then mount -n -o remount,ro /run; fi
cd /tmp
set +e
prlimit --nproc=$nproc --as=$as --cpu=$cpu --fsize=$fsize --nofile=$nofile --core=0 -- \
  setpriv --reuid=$uid --regid=$uid --clear-groups --no-new-privs \
  --inh-caps=-all --bounding-set=-all -- "$py" -I -B main.py
exit $?
"""

_SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


class SandboxUnavailableError(RuntimeError):
    """The machine does not allow the namespaces the sandbox needs."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run.

    Attributes:
      timeout_s: wall-clock seconds before the process tree is killed (> 0).
      memory_mb: address-space limit (RLIMIT_AS) in MiB of each process.
        Sizes, counts and ``cpu_s`` are integers.
      cpu_s: CPU-seconds limit (RLIMIT_CPU); None means ceil(timeout_s).
      max_processes: processes (tasks) the sandbox uid may hold (RLIMIT_NPROC).
      max_file_mb: largest file the program may write (RLIMIT_FSIZE), MiB.
      disk_mb: size of the tmpfs working directory, MiB.
      max_open_files: RLIMIT_NOFILE.
      max_output_bytes: bytes kept per stream; more ends the run (truncated).

    Raises ValueError on a non-positive limit or a non-integer size / count.
    """

    timeout_s: float = 5.0
    memory_mb: int = 512
    cpu_s: int | None = None
    max_processes: int = 16
    max_file_mb: int = 16
    disk_mb: int = 64
    max_open_files: int = 64
    max_output_bytes: int = 16384

    def __post_init__(self):
        def positive_int(value) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value > 0

        timeout = self.timeout_s
        if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
                and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"SandboxLimits.timeout_s must be a positive number, got {timeout!r}")
        # Sizes and counts go to prlimit / mount as integers: a fraction such as
        # memory_mb=0.5 would make the sandbox's own setup fail, not the program.
        for name in ("memory_mb", "max_processes", "max_file_mb", "disk_mb",
                     "max_open_files", "max_output_bytes"):
            value = getattr(self, name)
            if not positive_int(value):
                raise ValueError(f"SandboxLimits.{name} must be a positive integer, got {value!r}")
        if self.cpu_s is not None and not positive_int(self.cpu_s):
            raise ValueError(f"SandboxLimits.cpu_s must be a positive integer or None, "
                             f"got {self.cpu_s!r}")

    @property
    def cpu_limit_s(self) -> int:
        return int(self.cpu_s) if self.cpu_s is not None else max(1, math.ceil(self.timeout_s))


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """Outcome of one sandboxed run.

    Attributes:
      stdout, stderr: decoded output (UTF-8, invalid bytes replaced), each at
        most ``max_output_bytes`` bytes before decoding.
      exit_code: the program's exit status; 128 + N when signal N killed it
        (shell convention); None when the run was killed by the caller
        (timeout or output cap).
      timed_out: the wall-clock limit was hit.
      truncated: an output stream exceeded ``max_output_bytes``.
      duration_s: wall-clock seconds of the run (setup included).
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_s: float

    @property
    def ok(self) -> bool:
        """The program ran to completion with exit status 0."""
        return self.exit_code == 0 and not self.timed_out and not self.truncated


class _UidPool:
    """Unprivileged uids, one per concurrent run, so RLIMIT_NPROC is per run.

    uids are ``base + (pid % 10000) * slots + slot``: distinct between runs of
    this process, and between processes unless their pids agree modulo 10000.
    """

    def __init__(self, base: int = 1_000_000, slots: int = 256):
        self._base, self.slots = base, slots
        self._free = list(range(slots))
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            if not self._free:
                raise RuntimeError(
                    f"more than {self.slots} concurrent sandboxed runs in one process")
            slot = self._free.pop()
        return self._base + (os.getpid() % 10000) * self.slots + slot

    def release(self, uid: int) -> None:
        with self._lock:
            self._free.append((uid - self._base) % self.slots)


_UIDS = _UidPool()


@functools.lru_cache(maxsize=1)
def _probe() -> str | None:
    """None if the sandbox works here, else the reason it cannot."""
    if sys.platform != "linux":
        return f"the sandbox needs Linux namespaces (platform {sys.platform})"
    for tool in ("unshare", "prlimit", "setpriv", "mount", "sh", "cp"):
        if shutil.which(tool) is None:
            return f"the sandbox needs the {tool!r} command (util-linux / coreutils)"
    try:
        proc = subprocess.run(
            ["unshare", "--net", "--pid", "--mount", "--fork", "--kill-child", "true"],
            capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare failed: {e}"
    if proc.returncode != 0:
        return ("cannot create network/PID/mount namespaces (needs root or CAP_SYS_ADMIN): "
                + proc.stderr.decode(errors="replace").strip())
    # The whole chain once (mounts, limits, uid drop, this interpreter readable).
    workdir = tempfile.mkdtemp(prefix="sao-sandbox-probe-")
    uid = _UIDS.acquire()
    try:
        _write_files(workdir, "print('sandbox ok')", {})
        proc = subprocess.run(_command(workdir, uid, SandboxLimits(timeout_s=30), sys.executable),
                              capture_output=True, timeout=60, check=False, env=_SANDBOX_ENV,
                              start_new_session=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the sandbox probe failed: {e}"
    finally:
        _UIDS.release(uid)
        shutil.rmtree(workdir, ignore_errors=True)
    if proc.stdout != b"sandbox ok\n":
        return ("the sandbox probe did not run (mount/prlimit/setpriv, or the interpreter "
                f"{sys.executable} is not readable by an unprivileged uid): "
                + proc.stderr.decode(errors="replace").strip()[-500:])
    return None


def sandbox_available() -> bool:
    """True if this machine can run the sandbox (namespaces allowed, tools present)."""
    return _probe() is None


def _command(workdir: str, uid: int, limits: SandboxLimits, python: str) -> list[str]:
    return [
        "unshare", "--net", "--pid", "--mount", "--fork", "--kill-child", "--",
        "sh", "-c", _INIT_SCRIPT, "sao-sandbox-init",
        workdir, str(uid), str(limits.max_processes),
        str(limits.memory_mb * 1024 * 1024), str(limits.cpu_limit_s),
        str(limits.max_file_mb * 1024 * 1024), str(limits.max_open_files),
        str(limits.disk_mb), *_python_inside(python),
    ]


# Where an interpreter that lives under /tmp is mounted inside the sandbox
# (whose /tmp is the program's private working directory).
_KEPT_MOUNT = "/run/sao-python"


def _python_inside(python: str) -> tuple[str, str]:
    """``(interpreter path inside the sandbox, host directory to mount or '')``.

    An interpreter under /tmp (a clone's ``.venv``) would be hidden by the
    sandbox's own /tmp; its environment (a venv's root, or a plain
    interpreter's installation prefix) is mounted read-only at
    ``_KEPT_MOUNT`` instead (outside the working directory, so the program
    sees only its own files there) and run from that path: a venv finds its
    ``pyvenv.cfg`` next to the invoked executable, not the resolved one.
    """
    for exe in (os.path.abspath(python), os.path.realpath(python)):
        root = os.path.dirname(os.path.dirname(exe))  # <prefix>/bin/python -> <prefix>
        if root.startswith("/tmp/"):
            return _KEPT_MOUNT + exe[len(root):], root
    return python, ""


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the run's process group: ``unshare`` dies, ``--kill-child``
    kills the namespace's init, and the kernel kills the rest of the namespace."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_python(code: str, *, timeout_s: float = 5.0, memory_mb: int = 512,
               limits: SandboxLimits | None = None,
               files: Mapping[str, str | bytes] | None = None,
               stdin: str | None = None, python: str | None = None) -> ToolResult:
    """Runs ``code`` as ``main.py`` in a fresh sandbox (see module docstring).

    Blocking; safe to call from many threads at once. From asyncio use
    ``await run_python_async(...)``.

    Args:
      code: Python source text.
      timeout_s, memory_mb: wall-clock seconds and address-space MiB; ignored
        when ``limits`` is given.
      limits: all limits at once (``SandboxLimits``).
      files: extra files for the working directory, ``{relative name: content}``.
      stdin: text fed to the program's stdin (default: empty).
      python: interpreter path (default: this process's, so installed packages
        such as numpy / sympy are importable; it must be readable by an
        unprivileged uid).

    Returns a ``ToolResult``; hostile or broken code is reported in it, never
    raised. Raises SandboxUnavailableError if namespaces are not allowed here,
    ValueError on a bad file name (outside the working directory, or
    ``main.py``, which is ``code``) or limit, TypeError if ``code`` is not str.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be str, got {type(code).__name__}")
    limits = limits or SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb)
    reason = _probe()
    if reason is not None:
        raise SandboxUnavailableError(reason)
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="sao-sandbox-")
    uid = _UIDS.acquire()
    try:
        _write_files(workdir, code, files or {})
        proc = subprocess.Popen(
            _command(workdir, uid, limits, python or sys.executable),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=_SANDBOX_ENV, start_new_session=True)
        try:
            return _collect(proc, limits, stdin, start)
        finally:
            if proc.poll() is None:
                _kill_group(proc)
            proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
    finally:
        _UIDS.release(uid)
        shutil.rmtree(workdir, ignore_errors=True)


def _collect(proc: subprocess.Popen, limits: SandboxLimits, stdin: str | None,
             start: float) -> ToolResult:
    """Feeds stdin, reads both outputs up to the cap, enforces the deadline."""
    deadline = start + limits.timeout_s
    cap = limits.max_output_bytes
    out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    pending = memoryview(stdin.encode()) if stdin is not None else None
    timed_out = truncated = False
    with selectors.DefaultSelector() as sel:
        for fd in out:
            sel.register(fd, selectors.EVENT_READ)
        if pending is not None:
            if len(pending):
                os.set_blocking(proc.stdin.fileno(), False)
                sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
        while sel.get_map() and not truncated:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(remaining):
                fd = key.fd
                if fd in out:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        sel.unregister(fd)
                        continue
                    out[fd] += chunk
                    truncated = truncated or len(out[fd]) > cap
                    continue
                try:                                   # stdin is writable
                    pending = pending[os.write(fd, pending):]
                except BrokenPipeError:
                    pending = pending[:0]
                if not len(pending):
                    sel.unregister(fd)
                    proc.stdin.close()
    # The outputs ended; a program may still run (e.g. it closed them).
    if not timed_out and not truncated:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    killed = timed_out or truncated
    if killed:
        _kill_group(proc)
    exit_code = proc.wait()
    stdout, stderr = (bytes(b[:cap]).decode("utf-8", errors="replace") for b in out.values())
    return ToolResult(stdout=stdout, stderr=stderr, exit_code=None if killed else exit_code,
                      timed_out=timed_out, truncated=truncated,
                      duration_s=time.monotonic() - start)


_EXECUTOR: concurrent.futures.ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = concurrent.futures.ThreadPoolExecutor(
                max_workers=_UIDS.slots, thread_name_prefix="sao-sandbox")
        return _EXECUTOR


async def run_python_async(code: str, *, timeout_s: float = 5.0, memory_mb: int = 512,
                           limits: SandboxLimits | None = None,
                           files: Mapping[str, str | bytes] | None = None,
                           stdin: str | None = None,
                           python: str | None = None) -> ToolResult:
    """``run_python`` for asyncio: runs it on a dedicated thread pool (as many
    threads as uid slots), so many episodes' tools run at once without
    blocking the event loop. Same arguments, result and errors. A cancelled
    caller does not stop the run early; it still ends by its own limits.
    """
    call = functools.partial(run_python, code, timeout_s=timeout_s, memory_mb=memory_mb,
                             limits=limits, files=files, stdin=stdin, python=python)
    return await asyncio.get_running_loop().run_in_executor(_executor(), call)


def _write_files(workdir: str, code: str, files: Mapping[str, str | bytes]) -> None:
    if any(os.path.normpath(name) == "main.py" for name in files):
        raise ValueError("files must not contain main.py: the program is the `code` argument")
    entries = {"main.py": code, **files}
    for name, content in entries.items():
        path = os.path.normpath(os.path.join(workdir, name))
        if os.path.isabs(name) or not path.startswith(workdir + os.sep):
            raise ValueError(f"sandbox file name must be relative and inside the sandbox: {name!r}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        mode = "wb" if isinstance(content, bytes) else "w"
        with open(path, mode) as f:
            f.write(content)
