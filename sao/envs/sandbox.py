"""Sandboxed execution of untrusted Python (the agent's tool).

Each call runs the code in a fresh process tree, isolated with Linux
namespaces and util-linux tools (``unshare``, ``prlimit``, ``setpriv``):

* **network**: a new network namespace with no configured interface, so every
  connect (loopback included) fails with ``ENETUNREACH``;
* **processes**: a new PID namespace; the program runs as a per-call
  unprivileged uid (root is exempt from ``RLIMIT_NPROC``; an unprivileged
  uid is not), so the process limit holds; when the namespace's init exits or
  is killed every process in it dies, and the init dies with the caller (a
  parent-death signal), so nothing outlives the call or its caller;
* **files**: a new mount namespace in which every host mount is read-only
  (recursively: submounts too), the working directory is a fresh size-limited
  tmpfs mounted on ``/tmp`` (hiding the host's ``/tmp``), and the other
  world-writable places (``/var/tmp``, ``/dev/shm``, ``/dev/mqueue``) and
  ``/run`` (where host services keep their Unix sockets, e.g. ``docker.sock``,
  dbus) are empty read-only tmpfs; a pathname Unix socket elsewhere on the
  file system stays reachable if its mode lets any user write to it; files
  readable only by root stay unreadable (uid drop); the input files reach the
  sandbox in a memory file, so nothing is written to the host;
* **resources**: one CPU-time budget for the whole process tree (a cgroup per
  call where the machine allows it, sao/envs/sandbox_cpu.py), ``RLIMIT_AS``
  (memory), ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``,
  ``RLIMIT_NOFILE``, no core dumps, plus a wall-clock timeout enforced both by
  the caller and inside the sandbox;
* **output**: stdout and stderr are read up to ``max_output_bytes`` each; a
  program writing more is killed and the result marked ``truncated``.

The isolation needs root (or CAP_SYS_ADMIN) to create the namespaces;
``sandbox_available()`` says whether this machine allows it, and
``run_python`` raises ``SandboxUnavailableError`` rather than ever running
code unsandboxed. How a call starts: sao/envs/sandbox_launch.py; how the
caller watches it: sao/envs/sandbox_watch.py. The guarantees are proven by
tests/envs/test_sandbox*.py (see docs/envs.md and docs/reliability.md).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Mapping

from sao.envs import sandbox_cpu
from sao.envs.sandbox_launch import SANDBOX_ENV, TOOLS, UIDS, command, files_memfd
from sao.envs.sandbox_watch import kill_group, watch


class SandboxUnavailableError(RuntimeError):
    """The machine does not allow the namespaces the sandbox needs."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run.

    Attributes:
      timeout_s: wall-clock seconds before the process tree is killed (> 0);
        enforced by the caller and, as a backstop, inside the sandbox.
      memory_mb: address-space limit (RLIMIT_AS) in MiB of each process.
        Sizes, counts and ``cpu_s`` are integers.
      cpu_s: CPU seconds for the whole call, all its processes together
        (and RLIMIT_CPU of each); None means ceil(timeout_s).
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
      cpu_exceeded: the call's CPU budget (``SandboxLimits.cpu_limit_s``, all
        its processes together) ran out and its process tree was killed;
        ``exit_code`` is then 137 (SIGKILL).
      cpu_time_s: CPU seconds used by the call's whole process tree (setup
        and interpreter start included: about 0.07 s for an empty program);
        None where this machine has no per-call accounting
        (sao/envs/sandbox_cpu.py).
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_s: float
    cpu_exceeded: bool = False
    cpu_time_s: float | None = None

    @property
    def ok(self) -> bool:
        """The program ran to completion with exit status 0."""
        return (self.exit_code == 0 and not self.timed_out and not self.truncated
                and not self.cpu_exceeded)


@functools.lru_cache(maxsize=1)
def _probe() -> str | None:
    """None if the sandbox works here, else the reason it cannot."""
    if sys.platform != "linux":
        return f"the sandbox needs Linux namespaces (platform {sys.platform})"
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"the sandbox needs the {tool!r} command (util-linux / coreutils / tar)"
    try:
        proc = subprocess.run(
            ["unshare", "--net", "--pid", "--mount", "--fork", "--kill-child", "true"],
            capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare failed: {e}"
    if proc.returncode != 0:
        return ("cannot create network/PID/mount namespaces (needs root or CAP_SYS_ADMIN): "
                + proc.stderr.decode(errors="replace").strip())
    # The whole chain once (accounting group, mounts, limits, uid drop, this
    # interpreter readable).
    res = _run("print('sandbox ok')", SandboxLimits(timeout_s=30), {}, None, sys.executable)
    if res.stdout != "sandbox ok\n":
        return ("the sandbox probe did not run (mount/mount_setattr (Linux >= 5.12)/prlimit/"
                f"setpriv, or the interpreter {sys.executable} is not readable by an "
                "unprivileged uid): " + res.stderr.strip()[-500:])
    return None


def sandbox_available() -> bool:
    """True if this machine can run the sandbox (namespaces allowed, tools present)."""
    return _probe() is None


def cpu_budget_kind() -> str:
    """How a call's CPU budget is enforced here: "cgroup2" or "cgroup1" (one
    budget for the whole process tree), or "per-process" (RLIMIT_CPU only; see
    sao/envs/sandbox_cpu.py)."""
    acct = sandbox_cpu.backend()
    return acct.kind if acct is not None else "per-process"


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
    return _run(code, limits, files or {}, stdin, python or sys.executable)


def _run(code: str, limits: SandboxLimits, files: Mapping[str, str | bytes],
         stdin: str | None, python: str) -> ToolResult:
    start = time.monotonic()
    files_fd = files_memfd(code, files)
    acct = sandbox_cpu.backend()
    uid = group = proc = None
    try:
        uid = UIDS.acquire()
        group = acct.create() if acct is not None else None
        proc = subprocess.Popen(
            command(uid, limits, python, files_fd, group),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(files_fd,),
            env=SANDBOX_ENV, start_new_session=True)
        os.close(files_fd)
        files_fd = None
        seen = watch(proc, deadline=start + limits.timeout_s, cap=limits.max_output_bytes,
                     stdin=stdin, cpu_budget_s=limits.cpu_limit_s,
                     cpu_usage=functools.partial(acct.usage_s, group) if group else None)
    finally:
        if files_fd is not None:
            os.close(files_fd)
        if proc is not None:
            if proc.poll() is None:
                kill_group(proc)
            proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        used = acct.close(group) if group is not None else None
        if uid is not None:
            UIDS.release(uid)
    return ToolResult(
        stdout=seen.stdout.decode("utf-8", errors="replace"),
        stderr=seen.stderr.decode("utf-8", errors="replace"),
        exit_code=seen.exit_code, timed_out=seen.timed_out, truncated=seen.truncated,
        duration_s=time.monotonic() - start, cpu_exceeded=seen.cpu_exceeded,
        cpu_time_s=used if used is not None else seen.cpu_time_s)


_EXECUTOR: concurrent.futures.ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = concurrent.futures.ThreadPoolExecutor(
                max_workers=UIDS.slots, thread_name_prefix="sao-sandbox")
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
