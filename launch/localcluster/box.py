"""The box's state: its directory, the call log, tagged processes, and running tasks like a node.

Standard library only (the shims run under any ``python3``).
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from typing import Iterable, Sequence

DIR_ENV = "SAO_LOCALCLUSTER_DIR"
TAG_ENV = "SAO_LOCALCLUSTER_TAG"
DEFAULT_DIR = "/tmp/sao-localcluster"
CALLS = "calls.jsonl"
KILL_GRACE_S = 10.0


def root() -> str:
    path = os.path.abspath(os.environ.get(DIR_ENV) or DEFAULT_DIR)
    os.makedirs(path, exist_ok=True)
    return path


def log(tool: str, argv: Sequence[str], **extra) -> None:
    """Appends one record to ``<box>/calls.jsonl`` (locked: shims run concurrently)."""
    record = {"tool": tool, "argv": list(argv), "cwd": os.getcwd(), "time": time.time(), **extra}
    with open(os.path.join(root(), CALLS), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(record) + "\n")


def calls(box_dir: str) -> list[dict]:
    """Every record of a box's call log, in order (for tests and users)."""
    path = os.path.join(box_dir, CALLS)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def write_json(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def next_id(name: str) -> int:
    """A counter kept in ``<box>/<name>`` (1, 2, ...), safe across processes."""
    with open(os.path.join(root(), name), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        value = int(f.read().strip() or 0) + 1
        f.seek(0)
        f.truncate()
        f.write(str(value))
    return value


def tagged(box_dir: str, tag: str | None = None, exclude: Iterable[int] = ()) -> dict[int, str]:
    """``{pid: command line}`` of the live processes the box ``box_dir`` started
    (with ``tag``, or any tag), found by their environment."""
    box = f"{DIR_ENV}={os.path.abspath(box_dir)}".encode()
    want = f"{TAG_ENV}={tag}".encode() if tag else f"{TAG_ENV}=".encode()
    skip, out = {os.getpid(), *exclude}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z" or box not in env:
            continue
        if any(e == want or (not tag and e.startswith(want)) for e in env):
            out[int(name)] = cmd
    return out


def end_tagged(tag: str, reason: str, exclude: Iterable[int] = (), grace_s: float = 3.0) -> dict[int, str]:
    """Processes with ``tag`` still alive after ``grace_s``: logged as ``leftover``
    (with ``reason``), sent SIGTERM, SIGKILL after ``KILL_GRACE_S``. Returns them."""
    deadline = time.monotonic() + grace_s
    left = tagged(root(), tag, exclude)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = tagged(root(), tag, exclude)
    if not left:
        return {}
    log("box", [], event="leftover", tag=tag, reason=reason, processes={str(k): v for k, v in left.items()})
    kill(left, exclude)
    return left


def kill(pids: Iterable[int], exclude: Iterable[int] = (), tag: str | None = None) -> None:
    """SIGTERM to ``pids``, SIGKILL to those (or, with ``tag``, any tagged one) alive after the grace."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            break
        time.sleep(0.2)
    for pid in [p for p in pids if _alive(p)] + list(tagged(root(), tag, exclude) if tag else []):
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Tasks:
    """Commands run at once, each in its own process group (a node or a host), like
    ``srun`` / ``gcloud ... ssh --worker=all``: SIGTERM, SIGINT and SIGHUP to this
    process are passed to every group; ``wait`` returns the status to exit with."""

    def __init__(self, kill_on_bad_exit: bool = False):
        self.procs: list[subprocess.Popen] = []
        self.kill_on_bad_exit = kill_on_bad_exit
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._forward)

    def start(self, argv: Sequence[str], env: dict, cwd: str, stdout=None) -> None:
        self.procs.append(subprocess.Popen(list(argv), env=env, cwd=cwd, stdout=stdout,
                                           stderr=subprocess.STDOUT if stdout else None,
                                           stdin=subprocess.DEVNULL, preexec_fn=os.setpgrp))

    def _forward(self, sig, _frame) -> None:
        self.signal_all(signal.SIGTERM)

    def signal_all(self, sig: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    def wait(self) -> int:
        """Waits for all; the status is the first failure's (``128 + signal`` for a
        killed task, as a shell reports it), else 0. With ``kill_on_bad_exit`` the
        first failure ends the others (SIGTERM)."""
        status, pending = 0, list(self.procs)
        while pending:
            for p in list(pending):
                code = p.poll()
                if code is None:
                    continue
                pending.remove(p)
                code = 128 - code if code < 0 else code
                if code and not status:
                    status = code
                    if self.kill_on_bad_exit:
                        self.signal_all(signal.SIGTERM)
            time.sleep(0.1)
        return status


def env_for(tag: str, **extra: str) -> dict:
    """This process's environment, tagged, with ``extra`` set. ``SPT_NOENV=1`` keeps the tag
    readable: ``setproctitle`` (SGLang's scheduler and detokenizer call it) otherwise writes
    the new title over ``/proc/PID/environ`` and the process would escape ``tagged``."""
    return {**os.environ, DIR_ENV: root(), TAG_ENV: tag, "SPT_NOENV": "1",
            **{k: str(v) for k, v in extra.items()}}


def fail(tool: str, message: str, status: int = 1) -> None:
    print(f"{tool} (localcluster): {message}", file=sys.stderr)
    sys.exit(status)
