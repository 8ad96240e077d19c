"""Child processes that die with their parent and come back when they die alone.

Used for the rollout workers of ``--role=all`` (``sao.workers.spawn``):

* :func:`die_with_parent`: a child started with :func:`child_env` calls it
  first thing; the kernel then sends it SIGKILL when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``), so a SIGKILLed learner leaves no worker
  behind. A parent already gone by then (it died while the child started) is
  noticed through ``getppid`` and the child exits at once.
* :class:`Supervisor`: keeps its children running. A child that exits is
  started again with the same command after a backoff that doubles from
  ``initial_backoff_s`` up to ``max_backoff_s`` and starts over once a child
  has lived ``stable_s``. ``stop`` ends them all (SIGTERM, then SIGKILL).

The death signal belongs to the *thread* that started the child: the
supervisor starts restarted children from its own thread, which lives until
``stop``. Linux only (elsewhere :func:`die_with_parent` logs a warning and the
children outlive a killed parent).
"""
from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Mapping, Sequence

log = logging.getLogger(__name__)
PARENT_PID_ENV = "SAO_PARENT_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` plus this process's pid, for a child that calls :func:`die_with_parent`."""
    return {**env, PARENT_PID_ENV: str(os.getpid())}


def die_with_parent() -> bool:
    """Ties this process's life to the parent named by :func:`child_env`.

    Returns False (nothing done) without that variable; removes it from the
    environment so that this process's own children do not act on it. Exits
    at once (status 1) if the parent is already gone. Raises OSError if the
    kernel refuses the request.
    """
    pid = os.environ.pop(PARENT_PID_ENV, "")
    if not pid:
        return False
    if not sys.platform.startswith("linux"):
        log.warning("%s: no parent-death signal on %s; this process outlives a killed parent",
                    PARENT_PID_ENV, sys.platform)
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != int(pid):  # the parent died before the request took effect
        log.error("parent %s is gone; exiting", pid)
        os._exit(1)
    return True


@dataclasses.dataclass
class _Child:
    argv: list[str]
    log_path: str
    proc: subprocess.Popen
    started: float
    backoff_s: float
    restarts: int = 0
    restart_at: float | None = None


class Supervisor:
    """Starts children and restarts each one that exits (module doc).

    Args:
      env: environment of every child (:func:`child_env` is added).
      initial_backoff_s, max_backoff_s: the wait before a restart, doubling
        after each restart of the same child, capped.
      stable_s: a child that lived this long is restarted after
        ``initial_backoff_s`` again.
      poll_s: how often the watcher thread checks the children.
    Raises ValueError on a non-positive time or ``max_backoff_s < initial_backoff_s``.
    """

    def __init__(self, env: Mapping[str, str], *, initial_backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, stable_s: float = 60.0, poll_s: float = 0.2):
        if min(initial_backoff_s, stable_s, poll_s) <= 0 or max_backoff_s < initial_backoff_s:
            raise ValueError("backoffs, stable_s and poll_s must be > 0, max_backoff_s >= initial")
        self._env = dict(env)
        self._initial, self._max, self._stable, self._poll = (initial_backoff_s, max_backoff_s,
                                                              stable_s, poll_s)
        self._children: list[_Child] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def _popen(self, argv: Sequence[str], log_path: str, mode: str) -> subprocess.Popen:
        with open(log_path, mode) as out:
            return subprocess.Popen(list(argv), env=child_env(self._env), stdout=out,
                                    stderr=subprocess.STDOUT)

    # -- caller side ----------------------------------------------------------
    def add(self, argv: Sequence[str], log_path: str) -> int:
        """Starts a child (output to ``log_path``, truncated); returns its index."""
        proc = self._popen(argv, log_path, "w")
        with self._lock:
            self._children.append(_Child(list(argv), log_path, proc, time.monotonic(), self._initial))
            return len(self._children) - 1

    def proc(self, i: int) -> subprocess.Popen:
        """The current process of child ``i``."""
        with self._lock:
            return self._children[i].proc

    def restarts(self) -> list[int]:
        """Restarts so far, per child."""
        with self._lock:
            return [c.restarts for c in self._children]

    def set_argv(self, i: int, argv: Sequence[str]) -> None:
        """The command child ``i`` is restarted with from now on (e.g. its port fixed)."""
        with self._lock:
            self._children[i].argv = list(argv)

    def watch(self) -> "Supervisor":
        """Starts restarting children that exit (a daemon thread)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stops restarting, sends SIGTERM to every child, SIGKILL to those
        still running after ``timeout_s``, and waits for them."""
        self._stopping.set()
        with self._lock:  # the watcher starts nothing once it holds the lock after this
            procs = [c.proc for c in self._children]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- watcher thread -------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.wait(self._poll):
            with self._lock:
                if self._stopping.is_set():
                    return
                for i, c in enumerate(self._children):
                    self._tend(i, c, time.monotonic())

    def _tend(self, i: int, c: _Child, now: float) -> None:
        code = c.proc.poll()
        if code is None:
            return
        if c.restart_at is None:  # just noticed the exit
            if now - c.started >= self._stable:
                c.backoff_s = self._initial
            c.restart_at = now + c.backoff_s
            log.warning("child %d (pid %d) exited with status %s; restarting in %.1f s (see %s)",
                        i, c.proc.pid, code, c.backoff_s, c.log_path)
            c.backoff_s = min(2 * c.backoff_s, self._max)
            return
        if now < c.restart_at:
            return
        try:
            c.proc = self._popen(c.argv, c.log_path, "a")
        except OSError as e:  # try again after the next backoff
            log.error("restarting child %d failed: %s", i, e)
            c.restart_at = now + c.backoff_s
            c.backoff_s = min(2 * c.backoff_s, self._max)
            return
        c.started, c.restart_at, c.restarts = now, None, c.restarts + 1
