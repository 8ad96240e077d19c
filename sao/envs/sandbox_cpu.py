"""One CPU-time budget per sandboxed call, shared by its whole process tree.

``RLIMIT_CPU`` limits each process on its own: a program that starts N
processes may use N times the limit. The kernel has no CPU-time budget for a
group of processes, so each call gets its own cgroup (the sandbox's init joins
it before anything else runs, so every process of the call is counted), and
the caller reads the group's usage while the call runs and kills the tree once
it is spent (sao/envs/sandbox_watch.py). If the caller dies the tree dies with
it (parent-death signal, sao/envs/sandbox_launch.py), so the budget needs no
watcher of its own.

Accounting, chosen once per process at run time (the first that works, proven
by moving a process into a fresh group and reading a non-zero usage):

* ``cgroup2``: a group under this process's own cgroup in the cgroup v2
  hierarchy; usage from ``cpu.stat`` ``usage_usec``, which cgroup v2 keeps
  without any controller enabled, so it also works where all controllers are
  bound to cgroup v1 and the v2 mount is otherwise empty;
* ``cgroup1``: the same in the cgroup v1 ``cpuacct`` hierarchy
  (``cpuacct.usage``, nanoseconds);
* neither (``backend()`` returns None): only the per-process ``RLIMIT_CPU``
  holds, and a call's CPU time is bounded by ``timeout_s`` times the CPUs it
  can use (docs/envs.md, "CPU budget").

Groups are named ``<owner pid>.<owner start time>.<n>`` inside
``sao-sandbox/``; a caller killed mid-call leaves its group behind, and the
first sandbox use of any later process removes the groups of owners that no
longer exist (``sweep``).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import subprocess
import time

_PARENT = "sao-sandbox"
_COUNTER = itertools.count()


def _start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks since boot);
    None if the process does not exist. With the pid it names one process for
    good (a pid alone may be reused)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]


def owner_tag() -> str:
    """``<pid>.<start time>`` of this process."""
    return f"{os.getpid()}.{_start_time(os.getpid())}"


def owner_alive(tag: str) -> bool:
    """Whether the process that wrote ``tag`` (``owner_tag()``) still exists."""
    pid, _, start = tag.partition(".")
    return pid.isdigit() and _start_time(int(pid)) == start


@dataclasses.dataclass(frozen=True)
class CpuAccounting:
    """Per-call groups of one cgroup hierarchy.

    Attributes:
      kind: "cgroup2" or "cgroup1".
      parent: directory holding this process's groups (``.../sao-sandbox``).
    """

    kind: str
    parent: str

    @property
    def _usage_file(self) -> str:
        return "cpu.stat" if self.kind == "cgroup2" else "cpuacct.usage"

    def create(self) -> str:
        """A fresh empty group; returns its directory. Raises OSError."""
        path = os.path.join(self.parent, f"{owner_tag()}.{next(_COUNTER)}")
        os.makedirs(self.parent, exist_ok=True)
        os.mkdir(path)
        return path

    def usage_s(self, group: str) -> float:
        """CPU seconds used by every process that was ever in ``group``
        (those that exited included). Raises OSError."""
        with open(os.path.join(group, self._usage_file)) as f:
            text = f.read()
        if self.kind == "cgroup1":
            return int(text) / 1e9
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        raise OSError(f"no usage_usec in {group}/cpu.stat")

    def close(self, group: str, wait_s: float = 2.0) -> float | None:
        """Kills what is left in ``group`` (cgroup v2; under cgroup v1 the
        caller kills the PID namespace), waits up to ``wait_s`` for it to
        empty, and removes it. Returns its final CPU seconds, or None if it did
        not empty in time (then ``sweep`` removes it once this process is gone)
        or is already gone."""
        if self.kind == "cgroup2":
            try:
                with open(os.path.join(group, "cgroup.kill"), "w") as f:
                    f.write("1")
            except OSError:
                pass
        deadline = time.monotonic() + wait_s
        try:
            while True:
                with open(os.path.join(group, "cgroup.procs")) as f:
                    if not f.read().strip():
                        break
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.005)
            used = self.usage_s(group)
            os.rmdir(group)
            return used
        except OSError:
            return None

    def sweep(self) -> int:
        """Removes the groups of owners that no longer exist; returns how many."""
        removed = 0
        try:
            names = os.listdir(self.parent)
        except OSError:
            return 0
        for name in names:
            tag = name.rpartition(".")[0]
            path = os.path.join(self.parent, name)
            if tag and os.path.isdir(path) and not owner_alive(tag):
                self.close(path, wait_s=0.5)
                removed += not os.path.exists(path)
        return removed


def _mounts() -> list[tuple[str, str, str, str]]:
    """``(mount root, mount point, fs type, super options)`` per mount."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) >= 5 and len(rest) >= 3:
                out.append((fields[3], fields[4], rest[0], rest[2]))
    return out


def _own_paths() -> dict[str, str]:
    """This process's cgroup per hierarchy: ``{"": v2 path, "cpuacct": v1 path}``."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path
    return out


def candidates() -> list[CpuAccounting]:
    """The hierarchies this process could use, best first (not yet proven)."""
    try:
        mounts, own = _mounts(), _own_paths()
    except (OSError, ValueError):
        return []
    found = []
    for kind, fstype, key in (("cgroup2", "cgroup2", ""), ("cgroup1", "cgroup", "cpuacct")):
        for root, point, fs, options in mounts:
            if fs != fstype or key not in own or (key and key not in options.split(",")):
                continue
            path = own[key]
            if root != "/" and path.startswith(root):
                path = path[len(root):]
            found.append(CpuAccounting(
                kind, os.path.join(point, path.lstrip("/"), _PARENT).rstrip("/")))
            break
    return found


def prove(acct: CpuAccounting) -> str | None:
    """None if a process moved into a fresh group of ``acct`` shows up in its
    usage; else the reason it does not."""
    try:
        os.makedirs(acct.parent, exist_ok=True)
        group = acct.create()
    except OSError as e:
        return f"{acct.kind}: cannot create a group in {acct.parent}: {e}"
    try:
        proc = subprocess.run(
            ["sh", "-c", 'echo 0 > "$1/cgroup.procs" && i=0 && '
             'while [ $i -lt 20000 ]; do i=$((i+1)); done', "sh", group],
            capture_output=True, timeout=30, check=False)
        if proc.returncode != 0:
            return f"{acct.kind}: cannot join a group: {proc.stderr.decode(errors='replace')}"
        used = acct.usage_s(group)
        return None if used > 0 else f"{acct.kind}: usage stays 0"
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        return f"{acct.kind}: {e}"
    finally:
        acct.close(group)


@functools.lru_cache(maxsize=1)
def backend() -> CpuAccounting | None:
    """The accounting this process uses (first proven candidate), or None (the
    per-process fallback). The first call also removes dead owners' groups."""
    for acct in candidates():
        if prove(acct) is None:
            acct.sweep()
            return acct
    return None
