"""How one sandboxed call is started: its command line, its input files and its uid.

The command is ``setpriv --pdeathsig KILL unshare --net --pid --mount --fork
--kill-child bash -c INIT``: if the caller dies (even by SIGKILL) the kernel
kills ``unshare``, ``--kill-child`` turns that into the death of INIT, the
namespace's PID 1, and the death of PID 1 kills every process of the PID
namespace. INIT (``_INIT_SCRIPT``) builds the mount view, unpacks the input
files into a private tmpfs, then runs the program under its limits as an
unprivileged uid, with the wall clock enforced inside by ``timeout`` (so the
program also ends on time when the caller is stopped or starved).

The input files travel in an anonymous memory file (``memfd``) handed to INIT
as an open descriptor: nothing is written to the host's file system, so a
killed caller leaves no temp dir behind.
"""
from __future__ import annotations

import io
import os
import tarfile
import threading
from typing import Mapping

# Sets the read-only flag on a mount and every mount below it (mount_setattr,
# Linux >= 5.12; its syscall number is 442 on every architecture). Runs as root
# inside the sandbox's mount namespace, before the program starts.
_READ_ONLY_TREE = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
attr = (ctypes.c_uint64 * 4)(1, 0, 0, 0)   # attr_set = MOUNT_ATTR_RDONLY
for path in sys.argv[1:]:
    if libc.syscall(ctypes.c_long(442), ctypes.c_int(-100), path.encode(),
                    ctypes.c_uint(0x8000), attr, ctypes.c_size_t(32)) != 0:
        sys.exit("mount_setattr(%s, AT_RECURSIVE, MOUNT_ATTR_RDONLY) failed: %s"
                 % (path, os.strerror(ctypes.get_errno())))
"""

# Runs as root inside the new namespaces, as their init (PID 1): joins the
# call's CPU-accounting cgroup (if any, before anything else runs), builds the
# mount view, unpacks the files, then runs the program under limits as the
# sandbox uid and waits for it (keeping PID 1 out of the program, since PID 1
# ignores signals without handlers). Positional args: uid nproc as_bytes cpu_s
# fsize_bytes nofile disk_mb python keep files_fd cgroup wall_s ro_code.
# ``keep`` (may be empty) is a host directory under /tmp (the interpreter's
# environment when it lives there), mounted read-only at /run/sao-python
# (``python`` is then the path inside it; see python_inside). Every mount of
# the host is made read-only, recursively; /var/tmp, /dev/shm and /dev/mqueue
# get small read-only tmpfs; /run an empty one (read-only as well).
_INIT_SCRIPT = r"""
set -e
uid=$1 nproc=$2 as=$3 cpu=$4 fsize=$5 nofile=$6 disk=$7 py=$8 keep=$9
files=${10} cg=${11} wall=${12} ro=${13}
if [ -n "$cg" ]; then echo 0 > "$cg/cgroup.procs"; fi
mount -n --make-rprivate /
mount -n --rbind / /
if [ -d /run ]; then mount -n -t tmpfs -o size=4k,mode=0755 tmpfs /run; fi
if [ -n "$keep" ]; then
  mkdir /run/sao-python
  mount -n --rbind "$keep" /run/sao-python
fi
"$py" -I -S -c "$ro" /
mount -n -t proc -o nosuid,nodev,noexec proc /proc
mount -n -t tmpfs -o size=${disk}m,mode=0700,uid=$uid,gid=$uid,nosuid,nodev tmpfs /var/tmp
tar -x -C /var/tmp --no-same-owner -f - <&"$files"
exec {files}<&-
chown -R "$uid:$uid" /var/tmp
mount -n --move /var/tmp /tmp
for d in /var/tmp /dev/shm /dev/mqueue; do
  if [ -d "$d" ]; then mount -n -t tmpfs -o ro,size=4k,mode=0755 tmpfs "$d"; fi
done
cd /tmp
set +e
timeout --foreground -s KILL "$wall" \
  prlimit --nproc=$nproc --as=$as --cpu=$cpu --fsize=$fsize --nofile=$nofile --core=0 -- \
  setpriv --reuid=$uid --regid=$uid --clear-groups --no-new-privs \
  --inh-caps=-all --bounding-set=-all -- "$py" -I -B main.py
exit $?
"""

SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}

# Commands the launch needs (util-linux, coreutils, tar, bash: INIT closes a
# descriptor numbered above 9, which POSIX sh cannot).
TOOLS = ("setpriv", "unshare", "prlimit", "mount", "bash", "tar", "timeout", "chown")

# Where an interpreter that lives under /tmp is mounted inside the sandbox
# (whose /tmp is the program's private working directory).
KEPT_MOUNT = "/run/sao-python"


class UidPool:
    """Unprivileged uids, one per concurrent run, so RLIMIT_NPROC is per run.

    uids are ``base + (pid % 10000) * slots + slot``: distinct between runs of
    this process, and between processes unless their pids agree modulo 10000.
    """

    def __init__(self, base: int = 1_000_000, slots: int = 256):
        self.base, self.slots = base, slots
        self._free = list(range(slots))
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            if not self._free:
                raise RuntimeError(
                    f"more than {self.slots} concurrent sandboxed runs in one process")
            slot = self._free.pop()
        return self.base + (os.getpid() % 10000) * self.slots + slot

    def release(self, uid: int) -> None:
        with self._lock:
            self._free.append((uid - self.base) % self.slots)

    def uids_of(self, pid: int) -> range:
        """The uids process ``pid`` hands out."""
        first = self.base + (pid % 10000) * self.slots
        return range(first, first + self.slots)


UIDS = UidPool()


def command(uid: int, limits, python: str, files_fd: int, cgroup: str | None) -> list[str]:
    """The argv of one call (``limits``: a ``SandboxLimits``); ``files_fd`` is
    the descriptor from ``files_memfd`` (pass it with ``pass_fds``); ``cgroup``
    the call's accounting group, if any."""
    inside, keep = python_inside(python)
    return [
        "setpriv", "--pdeathsig", "KILL", "--",
        "unshare", "--net", "--pid", "--mount", "--fork", "--kill-child", "--",
        "bash", "-c", _INIT_SCRIPT, "sao-sandbox-init",
        str(uid), str(limits.max_processes),
        str(limits.memory_mb * 1024 * 1024), str(limits.cpu_limit_s),
        str(limits.max_file_mb * 1024 * 1024), str(limits.max_open_files),
        str(limits.disk_mb), inside, keep, str(files_fd), cgroup or "",
        f"{limits.timeout_s:.3f}", _READ_ONLY_TREE,
    ]


def python_inside(python: str) -> tuple[str, str]:
    """``(interpreter path inside the sandbox, host directory to mount or '')``.

    An interpreter under /tmp (a clone's ``.venv``) would be hidden by the
    sandbox's own /tmp; its environment (a venv's root, or a plain
    interpreter's installation prefix) is mounted read-only at
    ``KEPT_MOUNT`` instead (outside the working directory, so the program
    sees only its own files there) and run from that path: a venv finds its
    ``pyvenv.cfg`` next to the invoked executable, not the resolved one.
    """
    for exe in (os.path.abspath(python), os.path.realpath(python)):
        root = os.path.dirname(os.path.dirname(exe))  # <prefix>/bin/python -> <prefix>
        if root.startswith("/tmp/"):
            return KEPT_MOUNT + exe[len(root):], root
    return python, ""


def files_memfd(code: str, files: Mapping[str, str | bytes]) -> int:
    """A memory file holding a tar archive of ``main.py`` (``code``) and
    ``files``, positioned at its start; the caller closes it.

    Raises ValueError on a name outside the working directory or ``main.py``
    in ``files``; TypeError on content that is not str or bytes.
    """
    if any(os.path.normpath(name) == "main.py" for name in files):
        raise ValueError("files must not contain main.py: the program is the `code` argument")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in {"main.py": code, **files}.items():
            path = os.path.normpath(name)
            if os.path.isabs(name) or path == "." or path.split(os.sep)[0] == "..":
                raise ValueError(
                    f"sandbox file name must be relative and inside the sandbox: {name!r}")
            if not isinstance(content, (str, bytes)):
                raise TypeError(f"file {name!r}: content must be str or bytes, "
                                f"got {type(content).__name__}")
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    fd = os.memfd_create("sao-sandbox-files", os.MFD_CLOEXEC)
    try:
        view = memoryview(archive.getbuffer())
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
