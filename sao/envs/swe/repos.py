"""Where a task's repository comes from, and its starting state.

A task entry names its base repository in ``entry["base"]``:

* ``{"kind": "micro", "name": N}``: a tiny package committed in this
  repository (sao/envs/swe/micro/N/);
* ``{"kind": "sdist", "name", "version", "sha256"}``: a pinned PyPI sdist
  (sao/envs/swe/sources.py, fetched once into the content-addressed cache);
* ``{"kind": "git", "path", "commit"}``: a local git checkout at a commit
  (SWE-bench instances, sao/envs/swe/swebench.py).

The starting state is the base plus ``entry["bug"]`` (an exact line splice,
sao/envs/swe/files.py), if any. Bases are memoised per process.
"""
from __future__ import annotations

import functools
import pathlib
import subprocess
from typing import Any, Mapping

from sao.envs.swe.files import Files, apply_splice, check_path, from_tar

MICRO_DIR = pathlib.Path(__file__).resolve().parent / "micro"


def micro_names() -> list[str]:
    """The committed micro packages, sorted."""
    return sorted(p.name for p in MICRO_DIR.iterdir() if p.is_dir() and not p.name.startswith("_"))


@functools.lru_cache(maxsize=32)
def _micro(name: str) -> tuple[tuple[str, bytes], ...]:
    root = MICRO_DIR / name
    if not root.is_dir():
        raise ValueError(f"unknown micro package {name!r}; have {micro_names()}")
    return tuple(sorted((p.name, p.read_bytes()) for p in root.iterdir()
                        if p.is_file() and p.suffix == ".py"))


def micro_files(name: str) -> Files:
    """The files of micro package ``name`` (``name.py``, ``test_name.py``)."""
    return dict(_micro(name))


@functools.lru_cache(maxsize=16)
def _git(path: str, commit: str) -> tuple[tuple[str, bytes], ...]:
    try:
        data = subprocess.run(["git", "-C", path, "archive", "--format=tar", commit],
                              capture_output=True, check=True, timeout=300).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        err = getattr(e, "stderr", b"") or b""
        raise ValueError(f"cannot read commit {commit!r} of the git checkout {path!r}: "
                         f"{err.decode(errors='replace').strip() or e}") from e
    return tuple(sorted(from_tar(data).items()))


def git_files(path: str, commit: str) -> Files:
    """The tree of ``commit`` in the local git repository ``path`` (``git archive``)."""
    return dict(_git(str(path), str(commit)))


def base_files(base: Mapping[str, Any]) -> Files:
    """The base repository an entry names; raises ValueError on an unknown
    kind, SourceUnavailableError for an sdist neither cached nor downloadable."""
    kind = base.get("kind") if isinstance(base, Mapping) else None
    if kind == "micro":
        return micro_files(str(base["name"]))
    if kind == "sdist":
        from sao.envs.swe.sources import SOURCES, load_source
        source = SOURCES.get(str(base["name"]))
        if source is None or (source.version, source.sha256) != (base["version"], base["sha256"]):
            raise ValueError(f"sdist {base['name']}=={base['version']} is not a pinned source")
        return load_source(source)
    if kind == "git":
        return git_files(str(base["path"]), str(base["commit"]))
    raise ValueError(f"unknown base kind in {base!r:.200}")


def start_files(entry: Mapping[str, Any]) -> Files:
    """The repository the agent starts from: the base plus the entry's bug."""
    files = base_files(entry["base"])
    bug = entry.get("bug")
    if bug:
        path = check_path(str(bug["path"]))
        files[path] = apply_splice(files[path], bug)
    return files
