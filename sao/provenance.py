"""What code and software produced a run: one line per start in ``run_info.jsonl``.

A run that is stopped and resumed may continue under other code (a new
commit, an upgraded jax), so every start of ``sao.train.run`` appends its own
record to ``<workdir>/run_info.jsonl`` instead of overwriting one. Fields:

* ``started_at``: UTC time, ISO 8601;
* ``code_version``: ``git describe --always --dirty`` of the checkout the
  ``sao`` package was imported from (``"-dirty"``: uncommitted changes to
  tracked files), or ``"unknown"`` outside a git checkout or without git;
* ``commit``: the full commit id, or None;
* ``python``, ``jax``, ``jaxlib``, ``flax``, ``optax``: versions;
* ``argv``: the command line of the process.

Read with `read_run_info`; `sao.analysis` and the reproduction report use it
to say which code produced which run.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from importlib import metadata

from sao import storage

RUN_INFO_FILE = "run_info.jsonl"
_PACKAGES = ("jax", "jaxlib", "flax", "optax")


def _git(*args: str) -> str | None:
    """Output of ``git args`` run in the directory holding the ``sao`` package, or None."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(["git", "-C", here, *args], capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def run_info() -> dict:
    """This process's record (see the module docstring)."""
    info = {"started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "code_version": _git("describe", "--always", "--dirty") or "unknown",
            "commit": _git("rev-parse", "HEAD"), "python": platform.python_version()}
    for name in _PACKAGES:
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = None
    info["argv"] = list(sys.argv)
    return info


def record_start(workdir: str) -> dict:
    """Appends this start's `run_info` to ``<workdir>/run_info.jsonl``; returns it."""
    info = run_info()
    path = storage.join(workdir, RUN_INFO_FILE)
    previous = storage.read_text(path) if storage.exists(path) else ""
    storage.write_text(path, previous + json.dumps(info) + "\n")
    return info


def read_run_info(workdir: str) -> list[dict]:
    """Every start's record of the run in ``workdir``, oldest first ([] if none)."""
    path = storage.join(workdir, RUN_INFO_FILE)
    if not storage.exists(path):
        return []
    return [json.loads(line) for line in storage.read_text(path).splitlines() if line.strip()]
