"""A repository working copy whose commands run in the namespace sandbox.

``Workspace(files)`` holds the repository as data (``Files``). Each
``execute(command)`` starts a fresh sandbox (sao/envs/sandbox.py: no network,
read-only host, private tmpfs, its own uid, CPU / memory / process limits)
with the working copy unpacked at ``REPO_DIR``, runs the command there with
bash under a per-call wall-clock limit and output cap, and takes back the
files the command changed. State lives only in the ``Workspace`` object, so
a crashed or killed command leaves the last good copy. This is the plain
``execute(command, cwd, timeout) -> (returncode, output)`` API that an agent
harness's environment interface (e.g. mini-swe-agent's) can wrap.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import threading
from typing import Mapping

from sao.envs.sandbox import SandboxLimits, run_python
from sao.envs.swe import driver
from sao.envs.swe.files import IGNORED_DIRS, Files, check_path, is_ignored

REPO_DIR = driver.REPO_DIR


@dataclasses.dataclass(frozen=True)
class ExecLimits:
    """Limits of one workspace command.

    Attributes:
      timeout_s: wall-clock seconds of the command (its process group is
        killed then; > 0).
      max_output_bytes: merged stdout+stderr bytes kept; more is dropped and
        ``truncated`` set (the command keeps running).
      memory_mb: address space per process, MiB.
      disk_mb: size of the sandbox's tmpfs (repository plus scratch), MiB.
      max_change_mb: bytes of changed files one command may hand back, MiB;
        more discards that command's changes (reported as an error).
      max_processes: processes the sandbox uid may hold.
      cpu_s: CPU seconds for the call's whole process tree (None: ceil of the
        sandbox's wall-clock limit).

    Raises ValueError on a non-positive limit.
    """

    timeout_s: float = 30.0
    max_output_bytes: int = 65536
    memory_mb: int = 2048
    disk_mb: int = 256
    max_change_mb: int = 16
    max_processes: int = 64
    cpu_s: int | None = None

    def __post_init__(self):
        if not (isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s)
                and self.timeout_s > 0):
            raise ValueError(f"ExecLimits.timeout_s must be > 0, got {self.timeout_s!r}")
        for name in ("max_output_bytes", "memory_mb", "disk_mb", "max_change_mb",
                     "max_processes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ExecLimits.{name} must be a positive integer, got {value!r}")

    def sandbox(self, timeout_s: float) -> SandboxLimits:
        """The sandbox limits of a call whose command may run ``timeout_s``:
        the command's time plus room for the snapshot, and an output cap that
        fits the frame (base64 of output and changes)."""
        frame = 2 * (self.max_output_bytes + 2 * self.max_change_mb * 2 ** 20) + 2 ** 16
        return SandboxLimits(timeout_s=timeout_s + 30.0, memory_mb=self.memory_mb,
                             cpu_s=self.cpu_s, max_processes=self.max_processes,
                             max_file_mb=min(self.disk_mb, 64), disk_mb=self.disk_mb,
                             max_open_files=256, max_output_bytes=frame)


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """One command's outcome.

    Attributes:
      returncode: the command's exit status; None if it timed out or the
        sandbox failed before it ended.
      output: merged stdout and stderr (UTF-8, invalid bytes replaced), at
        most ``max_output_bytes`` bytes before decoding.
      timed_out: the command hit its wall-clock limit (its changes up to then are kept).
      truncated: output beyond the cap was dropped.
      error: why the call's changes were discarded or the call failed
        (sandbox killed, frame missing, changes too large), else None.
      changed: paths written or created; deleted: paths removed.
      collected: bytes of the ``collect`` file, if asked for and present.
      duration_s: wall-clock seconds of the whole sandbox call.
    """

    returncode: int | None
    output: str
    timed_out: bool = False
    truncated: bool = False
    error: str | None = None
    changed: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    collected: bytes | None = None
    duration_s: float = 0.0


def execute_files(files: Mapping[str, bytes], command: str, *, cwd: str = "",
                  limits: ExecLimits | None = None, timeout_s: float | None = None,
                  extra_files: Mapping[str, bytes] | None = None, stdin: bytes | None = None,
                  collect: str | None = None, env: Mapping[str, str] | None = None,
                  python: str | None = None) -> tuple[ExecResult, Files]:
    """Runs ``command`` (bash) on a copy of ``files`` in a fresh sandbox.

    Args:
      files: the repository, unpacked at ``REPO_DIR``.
      command: bash command line.
      cwd: directory relative to the repository root (or absolute under
        ``REPO_DIR``); a missing one falls back to the root.
      limits: ``ExecLimits``; timeout_s overrides its ``timeout_s``.
      extra_files: files put in the sandbox's scratch directory beside the
        repository (``/tmp/<name>``), not part of it (e.g. a patch).
      stdin: bytes fed to the command.
      collect: absolute sandbox path of a file to bring back (e.g. a report).
      env: extra environment variables of the command.
      python: the interpreter that runs the driver; its directory comes
        first on the command's PATH (default: this process's, so ``python``
        and ``pytest`` are this venv's).

    Returns ``(result, new files)``; the new files equal ``files`` plus the
    command's changes, or ``files`` unchanged when ``result.error`` says the
    changes were discarded. Raises SandboxUnavailableError where namespaces
    are not allowed, TypeError / ValueError on bad arguments.
    """
    if not isinstance(command, str):
        raise TypeError(f"command must be str, got {type(command).__name__}")
    limits = limits or ExecLimits()
    timeout = float(timeout_s if timeout_s is not None else limits.timeout_s)
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be > 0, got {timeout_s!r}")
    if cwd.startswith(REPO_DIR):
        cwd = cwd[len(REPO_DIR):].lstrip("/")
    cfg = {"command": command, "cwd": cwd, "timeout": timeout,
           "max_output": limits.max_output_bytes, "max_change": limits.max_change_mb * 2 ** 20,
           "collect": collect, "env": dict(env or {}),
           "stdin": "/tmp/sao_stdin" if stdin is not None else None}
    box = {"repo/" + p: d for p, d in files.items()}
    for name, data in (extra_files or {}).items():
        box[check_path(name)] = data
    box["sao_exec.json"] = json.dumps(cfg).encode()
    if stdin is not None:
        box["sao_stdin"] = bytes(stdin)
    res = run_python(driver.source(IGNORED_DIRS), limits=limits.sandbox(timeout), files=box,
                     python=python)
    frame = _frame(res.stdout)
    if frame is None:
        why = ("timed out" if res.timed_out else "output cap hit" if res.truncated
               else "CPU limit" if res.cpu_exceeded else f"exit status {res.exit_code}")
        return ExecResult(None, res.stderr[-2000:], timed_out=res.timed_out,
                          error=f"the sandbox call failed ({why}); no changes kept",
                          duration_s=res.duration_s), dict(files)
    try:
        return _apply(frame, files, res.duration_s)
    except (KeyError, TypeError, ValueError, binascii.Error) as e:
        return ExecResult(None, "", error=f"malformed workspace frame: {e}",
                          duration_s=res.duration_s), dict(files)


def _frame(stdout: str) -> dict | None:
    at = stdout.rfind(driver.FRAME_MARK)
    if at < 0:
        return None
    try:
        frame = json.loads(stdout[at + len(driver.FRAME_MARK):])
    except json.JSONDecodeError:
        return None
    return frame if isinstance(frame, dict) else None


def _apply(frame: dict, files: Mapping[str, bytes], duration: float) -> tuple[ExecResult, Files]:
    rc = frame["returncode"]
    if rc is not None and not isinstance(rc, int):
        raise TypeError("returncode")
    output = base64.b64decode(frame["output"]).decode("utf-8", "replace")
    collected = frame.get("collected")
    collected = base64.b64decode(collected) if isinstance(collected, str) else None
    error = frame.get("error")
    base = dict(files)
    changed: list[str] = []
    deleted: list[str] = []
    if not error:
        for rel, data in dict(frame["changed"]).items():
            path = check_path(rel)
            if not is_ignored(path):
                base[path] = base64.b64decode(data)
                changed.append(path)
        for rel in list(frame["deleted"]):
            path = check_path(rel)
            if base.pop(path, None) is not None:
                deleted.append(path)
    return ExecResult(rc, output, timed_out=bool(frame.get("timed_out")),
                      truncated=bool(frame.get("truncated")),
                      error=str(error)[:500] if error else None, changed=tuple(changed),
                      deleted=tuple(deleted), collected=collected, duration_s=duration), base


class Workspace:
    """A repository working copy; commands run in the sandbox, state stays here.

    Thread-safe (calls are serialised). ``files`` is the current copy.
    """

    def __init__(self, files: Mapping[str, bytes], limits: ExecLimits | None = None,
                 python: str | None = None):
        self._files: Files = {check_path(p): bytes(d) for p, d in files.items()}
        self.limits = limits or ExecLimits()
        self.python = python
        self._lock = threading.Lock()

    @property
    def files(self) -> Files:
        with self._lock:
            return dict(self._files)

    def replace_files(self, files: Mapping[str, bytes]) -> None:
        """Sets the working copy (e.g. after a host-side edit)."""
        with self._lock:
            self._files = dict(files)

    def run(self, command: str, cwd: str = "", timeout: float | None = None,
            **kw) -> ExecResult:
        """Runs ``command`` and keeps its changes; see ``execute_files``."""
        with self._lock:
            res, self._files = execute_files(self._files, command, cwd=cwd, limits=self.limits,
                                             timeout_s=timeout, python=self.python, **kw)
        return res

    def execute(self, command: str, cwd: str = "", timeout: float | None = None) -> dict:
        """mini-swe-agent style: ``{"returncode": int, "output": str}``
        (returncode -1 when the command timed out or the call failed; the
        output then ends with a note saying so)."""
        res = self.run(command, cwd=cwd, timeout=timeout)
        output = res.output
        if res.truncated:
            output += "\n[output truncated]"
        if res.timed_out:
            output += f"\n[timed out after {timeout or self.limits.timeout_s:g} s]"
        if res.error:
            output += f"\n[{res.error}]"
        return {"returncode": res.returncode if res.returncode is not None else -1,
                "output": output}
