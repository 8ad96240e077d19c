"""The caller's side of a running sandbox: feeds stdin, reads both outputs up
to their cap, and ends the call at its wall-clock deadline or when its CPU
budget is spent (see sao/envs/sandbox_cpu.py)."""
from __future__ import annotations

import dataclasses
import os
import selectors
import signal
import subprocess
import time
from typing import Callable

# How often the CPU budget is checked: the wait is the remaining budget spread
# over the CPUs this process may use, kept within these bounds (seconds). The
# overshoot past the budget is at most about _MIN_TICK times the CPU count.
_MIN_TICK, _MAX_TICK = 0.005, 0.1
_CPUS = len(os.sched_getaffinity(0))


@dataclasses.dataclass
class Outcome:
    """What the watcher saw (the caller turns it into a ``ToolResult``)."""

    stdout: bytes
    stderr: bytes
    exit_code: int | None
    timed_out: bool
    truncated: bool
    cpu_exceeded: bool
    cpu_time_s: float | None


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the run's process group: ``unshare`` dies, ``--kill-child``
    kills the namespace's init, and the kernel kills the rest of the namespace."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def watch(proc: subprocess.Popen, *, deadline: float, cap: int, stdin: str | None,
          cpu_budget_s: float, cpu_usage: Callable[[], float] | None) -> Outcome:
    """Runs the call to its end and kills its process tree if a limit is hit.

    Args:
      proc: the started call (stdout / stderr pipes; a stdin pipe iff ``stdin``).
      deadline: ``time.monotonic()`` value at which the call times out.
      cap: bytes kept per output stream; more ends the call (``truncated``).
      stdin: text fed to the program.
      cpu_budget_s: CPU seconds the whole tree may use.
      cpu_usage: returns the tree's CPU seconds so far; None when this machine
        has no per-call accounting (then only RLIMIT_CPU holds, per process).

    A program killed for its CPU budget gets ``exit_code`` 128 + 9 (SIGKILL),
    like one the kernel kills at its RLIMIT_CPU; a timeout or the output cap
    gives ``exit_code`` None.
    """
    out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    pending = memoryview(stdin.encode()) if stdin is not None else None
    timed_out = truncated = cpu_exceeded = False
    used = 0.0

    def tick() -> float:
        """Seconds to wait before the next check (deadline and budget);
        sets ``timed_out`` / ``cpu_exceeded`` when one is reached."""
        nonlocal timed_out, cpu_exceeded, used
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            return 0.0
        if cpu_usage is None:
            return remaining
        try:
            used = cpu_usage()
        except OSError:
            return min(remaining, _MAX_TICK)
        if used >= cpu_budget_s:
            cpu_exceeded = True
            return 0.0
        return min(remaining, max(_MIN_TICK, min(_MAX_TICK, (cpu_budget_s - used) / _CPUS)))

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
            wait = tick()
            if timed_out or cpu_exceeded:
                break
            for key, _ in sel.select(wait):
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
    while not (timed_out or truncated or cpu_exceeded):
        wait = tick()
        if timed_out or cpu_exceeded:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            pass
    ended = time.monotonic()
    if timed_out or truncated or cpu_exceeded:
        kill_group(proc)
    exit_code = proc.wait()
    # Ended after its deadline (the caller was late to look, and the sandbox's
    # own clock may have ended it): a timeout all the same.
    timed_out = timed_out or (not (truncated or cpu_exceeded) and ended > deadline)
    killed = timed_out or truncated
    stdout, stderr = (bytes(b[:cap]) for b in out.values())
    return Outcome(stdout=stdout, stderr=stderr,
                   exit_code=None if killed else 128 + 9 if cpu_exceeded else exit_code,
                   timed_out=timed_out, truncated=truncated, cpu_exceeded=cpu_exceeded,
                   cpu_time_s=used if cpu_usage is not None else None)
