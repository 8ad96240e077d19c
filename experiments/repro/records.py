"""The sweep's committed record of finished runs, and the clean-tree rule.

A run directory (``RUNS/<arm>/seed<S>``, ``experiments.repro.sweep``) holds
checkpoints, published weights and logs: megabytes, kept on the machine that
ran it. What the report needs of a finished run is small, and is copied
into ``experiments/repro/runs/<arm>/seed<S>/`` (``RECORDS``, committed with
the repository) as soon as the run finishes: ``summary.json``,
``eval_before.json``, ``attempts.json`` (each attempt's commit),
``run_info.jsonl``, ``config.json`` and ``metrics.jsonl`` without the
per-part CPU timings (``time/*_cpu_s``). The seed's SFT warm start leaves
its ``result.json`` under ``_sft/seed<S>/`` (a warm start of its own, as the
drift arms': ``_sft_<arm>/seed<S>/``). So a sweep continues on a new
machine from a checkout (finished runs are skipped) and ``sweep report``
regenerates RESULTS.md from the repository alone.

Only runs of clean commits are recorded: ``sweep run`` refuses a tree with
uncommitted changes (:func:`git_state`; the records folder itself does not
count), and a run any of whose attempts was started from a dirty tree
(``--allow_dirty``, for development) is never copied here.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDS = os.path.join(REPO, "experiments", "repro", "runs")
RUN_FILES = ("summary.json", "eval_before.json", "attempts.json", "run_info.jsonl", "config.json")
METRICS = "metrics.jsonl"
_SLIM = re.compile(r"^time/.*_cpu_s$")      # per-part CPU seconds: bulky, not reported


def git_state(repo: str = REPO, *, exclude: str | None = None) -> dict:
    """``{"commit": full id or None, "clean": bool, "changes": [porcelain lines]}`` of the
    checkout at ``repo``; changes under ``exclude`` (default: the repo's records folder)
    do not count, untracked files do (they could be code). Without git: commit None, not
    clean."""
    exclude = os.path.join(repo, os.path.relpath(RECORDS, REPO)) if exclude is None else exclude
    def git(*args):
        try:
            out = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                                 timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None
    commit = git("rev-parse", "HEAD")
    rel = os.path.relpath(exclude, repo)
    status = git("status", "--porcelain", "--", ".", f":(exclude){rel}")
    changes = [] if status is None else [line for line in status.splitlines() if line.strip()]
    return {"commit": commit.strip() if commit else None,
            "clean": commit is not None and status is not None and not changes,
            "changes": changes}


def require_clean(repo: str = REPO, *, exclude: str | None = None) -> str:
    """The commit of a clean checkout; raises RuntimeError naming the changes otherwise."""
    state = git_state(repo, exclude=exclude)
    if not state["clean"]:
        shown = "; ".join(state["changes"][:5]) or "not a git checkout"
        raise RuntimeError(f"the tree at {repo} has uncommitted changes ({shown}"
                           f"{'; ...' if len(state['changes']) > 5 else ''}): commit them first, "
                           "so that every run names the code that produced it (--allow_dirty "
                           "runs anyway; such runs are never recorded nor reported)")
    return state["commit"]


def record_dir(records: str, arm: str, seed: int) -> str:
    return os.path.join(records, arm, f"seed{seed}")


def is_recorded(records: str, arm: str, seed: int) -> bool:
    """True when a finished run of ``arm`` x ``seed`` is in ``records``."""
    return os.path.exists(os.path.join(record_dir(records, arm, seed), "summary.json"))


def attempts_clean(attempts: dict) -> bool:
    """True when every attempt of a run was started from a clean tree (``attempts.json``)."""
    runs = attempts.get("runs", [])
    return bool(runs) and all(a.get("clean") is True and a.get("commit") for a in runs)


def record_run(run_dir: str, dest: str) -> bool:
    """Copies the finished run's small files (module doc) from ``run_dir`` into ``dest``;
    returns False (nothing copied) unless it finished (``summary.json``) from clean
    commits only. Written into a sibling folder first and renamed, so ``dest`` is whole."""
    if not os.path.exists(os.path.join(run_dir, "summary.json")):
        return False
    path = os.path.join(run_dir, "attempts.json")
    attempts = json.load(open(path, encoding="utf-8")) if os.path.exists(path) else {}
    if not attempts_clean(attempts):
        return False
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in RUN_FILES:
        if os.path.exists(os.path.join(run_dir, name)):
            shutil.copyfile(os.path.join(run_dir, name), os.path.join(tmp, name))
    src = os.path.join(run_dir, METRICS)
    if os.path.exists(src):
        with open(src, encoding="utf-8") as f, open(os.path.join(tmp, METRICS), "w",
                                                     encoding="utf-8") as out:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue                      # a truncated last line
                out.write(json.dumps({k: v for k, v in rec.items() if not _SLIM.match(k)}) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    os.replace(tmp, dest)
    return True


def record_sft(sft_run_dir: str, records: str, seed: int, name: str = "_sft") -> None:
    """Copies the seed's SFT ``result.json`` (its loss and seconds) into ``records/<name>/``
    (``name``: ``sweep.sft_name`` of the warm start)."""
    src = os.path.join(sft_run_dir, "sft", "result.json")
    if os.path.exists(src):
        dest = os.path.join(records, name, f"seed{seed}")
        os.makedirs(dest, exist_ok=True)
        shutil.copyfile(src, os.path.join(dest, "result.json"))
