"""A repository as data: ``{relative posix path: bytes}``, and exact edits of it.

Every repository the SWE tasks touch (an sdist, a micro package, a git
checkout, an agent's working copy) travels as a ``Files`` mapping, so that
nothing of it is ever written to the host's file system by an episode: the
sandbox receives it in a memory file (sao/envs/sandbox_launch.py).
"""
from __future__ import annotations

import difflib
import hashlib
import io
import json
import posixpath
import tarfile
from typing import Iterable, Mapping

Files = dict[str, bytes]

# Directory names never part of a repository's state (caches, VCS, build output).
IGNORED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".git", ".tox", ".eggs",
                          ".mypy_cache", ".hypothesis"})
# Config files that steer pytest: restored from the original when grading.
CONFIG_FILES = frozenset({"setup.cfg", "pyproject.toml", "tox.ini", "pytest.ini", "conftest.py",
                          "setup.py"})


def check_path(path: str) -> str:
    """Normalised relative posix path; raises ValueError if ``path`` is empty,
    absolute, leaves the repository (``..``) or names an ignored directory."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise ValueError(f"bad repository path {path!r}")
    norm = posixpath.normpath(path)
    if norm.startswith("/") or norm == "." or norm.split("/")[0] == "..":
        raise ValueError(f"path must be relative and inside the repository: {path!r}")
    if any(part in IGNORED_DIRS for part in norm.split("/")):
        raise ValueError(f"path is inside an ignored directory: {path!r}")
    return norm


def is_ignored(path: str) -> bool:
    """True for cache / VCS paths that are never part of a repository's state."""
    parts = path.split("/")
    return any(p in IGNORED_DIRS for p in parts) or path.endswith((".pyc", ".pyo"))


def is_test_path(path: str) -> bool:
    """Test files and pytest configuration: ``test_*.py``, ``*_test.py``,
    ``conftest.py``, anything under a ``test``/``tests``/``testing`` directory,
    and the config files in ``CONFIG_FILES``. An agent's changes to these are
    discarded when it is graded."""
    parts = path.split("/")
    name = parts[-1]
    return (name in CONFIG_FILES or name.startswith("test_") or name.endswith("_test.py")
            or any(p in ("test", "tests", "testing") for p in parts[:-1]))


def tree_hash(files: Mapping[str, bytes]) -> str:
    """sha256 over the sorted paths and contents (hex): the content address of a tree."""
    h = hashlib.sha256()
    for path in sorted(files):
        data = files[path]
        h.update(json.dumps([path, len(data)]).encode())
        h.update(data)
    return h.hexdigest()


def from_tar(data: bytes, *, strip: int = 0, skip: Iterable[str] = ()) -> Files:
    """Regular files of a (possibly compressed) tar archive, ``strip`` leading
    components removed; links, devices and unsafe names are dropped; ``skip``
    lists path prefixes to leave out. Raises tarfile.TarError on a bad archive."""
    out: Files = {}
    skip = tuple(skip)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for member in tar.getmembers():
            if not member.isreg():
                continue
            parts = member.name.split("/")[strip:]
            if not parts:
                continue
            try:
                path = check_path("/".join(parts))
            except ValueError:
                continue
            if is_ignored(path) or path.startswith(skip):
                continue
            fh = tar.extractfile(member)
            out[path] = fh.read() if fh is not None else b""
    return out


def unified_diff(before: Mapping[str, bytes], after: Mapping[str, bytes]) -> str:
    """A git-style unified diff (``a/`` ``b/`` prefixes, ``/dev/null`` for added
    or deleted files) from ``before`` to ``after``; text is decoded as UTF-8
    with replacement; "" when equal."""
    chunks = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        a = old.decode("utf-8", "replace").splitlines(keepends=True) if old is not None else []
        b = new.decode("utf-8", "replace").splitlines(keepends=True) if new is not None else []
        lines = list(difflib.unified_diff(
            a, b, fromfile=f"a/{path}" if old is not None else "/dev/null",
            tofile=f"b/{path}" if new is not None else "/dev/null"))
        if not lines:
            continue
        chunks.append(f"diff --git a/{path} b/{path}\n")
        for line in lines:
            chunks.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(chunks)


def changed_lines(before: Mapping[str, bytes], after: Mapping[str, bytes]) -> int:
    """Lines added plus lines removed between two trees (the size of a patch)."""
    diff = unified_diff(before, after)
    return sum(1 for line in diff.splitlines()
               if line[:1] in "+-" and not line.startswith(("+++", "---")))


def splice(before: bytes, after: bytes) -> dict:
    """The smallest line range edit turning ``before`` into ``after``:
    ``{"start": 0-based line, "old": [lines], "new": [lines]}`` (lines keep
    their newlines). ``apply_splice`` checks ``old`` before replacing."""
    a = before.decode("utf-8").splitlines(keepends=True)
    b = after.decode("utf-8").splitlines(keepends=True)
    lo = 0
    while lo < min(len(a), len(b)) and a[lo] == b[lo]:
        lo += 1
    hi = 0
    while hi < min(len(a), len(b)) - lo and a[len(a) - 1 - hi] == b[len(b) - 1 - hi]:
        hi += 1
    return {"start": lo, "old": a[lo:len(a) - hi], "new": b[lo:len(b) - hi]}


def apply_splice(content: bytes, edit: Mapping) -> bytes:
    """``content`` with ``edit`` (from ``splice``) applied; raises ValueError
    if the lines it replaces are not there."""
    lines = content.decode("utf-8").splitlines(keepends=True)
    start, old, new = int(edit["start"]), list(edit["old"]), list(edit["new"])
    if lines[start:start + len(old)] != old:
        raise ValueError(f"splice does not apply at line {start + 1}")
    return "".join(lines[:start] + new + lines[start + len(old):]).encode("utf-8")


def overlay_editable(base: Mapping[str, bytes], work: Mapping[str, bytes],
                     protected: Iterable[str] = ()) -> Files:
    """What the grader tests: ``base`` plus the agent's changes in ``work`` to
    files that are not tests or config (``is_test_path``) and not in
    ``protected``. Test files the agent edited, added or deleted come back as
    in ``base``, so editing the tests earns nothing."""
    protected = set(protected)

    def editable(path: str) -> bool:
        return path not in protected and not is_test_path(path)

    out = {p: d for p, d in base.items() if not editable(p)}
    out.update({p: d for p, d in work.items() if editable(p)})
    return out
