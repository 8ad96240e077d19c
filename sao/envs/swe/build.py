"""Building validated repository tasks from a seed, cached by content hash.

For each base repository (a micro package or a pinned sdist):

1. run its tests once (original): the passing set ``P0``;
2. for each candidate bug (sao/envs/swe/bugs.py, seeded order): run the
   tests on the bugged tree; FAIL_TO_PASS = ``P0`` minus what passes now,
   PASS_TO_PASS = ``P0`` that still passes; a bug that breaks nothing (or
   times out) is rejected;
3. validate the fix: apply the task's oracle ``patch`` (text, with ``git
   apply``) to the bugged tree in a fresh sandbox and grade it exactly as an
   agent's attempt is graded (sao/envs/swe/testrun.py): it must score 1.0.

A tier's build is cached as JSON under ``<cache>/tasks/<key>.json`` where
the key hashes everything that decides its content (build version, base
trees, test specs, seed, counts, modifier settings, swesmith's version), so
a second build from the same seed reads the same tasks and any change of
input rebuilds.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import pathlib
import time
from typing import Any, Callable, Iterable, Mapping

from sao.envs.swe import repos
from sao.envs.swe.bugs import generate_bugs
from sao.envs.swe.files import Files, splice, tree_hash, unified_diff
from sao.envs.swe.testrun import TestSpec, grade_files, run_tests

BUILD_VERSION = 4
TIERS = ("micro", "source")
# Tasks per base repository unless asked otherwise: 6 x 4 = 24 micro tasks,
# 5 x 5 = 25 source tasks (one cache entry serves every default caller).
DEFAULT_PER_REPO = {"micro": 4, "source": 5}
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BaseRepo:
    """One base repository of a tier: its entry ``base``, files, where bugs
    go, how its tests run, and the edit size and complexity of its bugs."""

    name: str
    base: dict
    files: Files
    src_dirs: tuple[str, ...]
    spec: TestSpec
    max_changed_lines: int
    min_complexity: int | None


def tier_bases(tier: str, *, download: bool = True) -> list[BaseRepo]:
    """The base repositories of ``tier`` (``"micro"`` or ``"source"``)."""
    if tier == "micro":
        return [BaseRepo(n, {"kind": "micro", "name": n}, repos.micro_files(n), (f"{n}.py",),
                         TestSpec(timeout_s=300.0, cpu_s=30), 1, 1)
                for n in repos.micro_names()]
    if tier == "source":
        from sao.envs.swe.sources import SOURCES, load_source
        return [BaseRepo(s.name, {"kind": "sdist", "name": s.name, "version": s.version,
                                  "sha256": s.sha256},
                         load_source(s, download=download), s.src_dirs,
                         TestSpec(pythonpath=s.pythonpath, pytest_args=s.pytest_args,
                                  timeout_s=900.0, cpu_s=90),
                         4, None) for s in SOURCES.values()]
    raise ValueError(f"unknown tier {tier!r}; expected one of {TIERS}")


def problem_statement(repo: str, fail_to_pass: list[str], explanation: str) -> str:
    """The issue text of a task: which tests fail, the modifier's hint."""
    shown = ", ".join(fail_to_pass[:3])
    more = f" and {len(fail_to_pass) - 3} more" if len(fail_to_pass) > 3 else ""
    return (f"Tests fail in {repo}: {shown}{more}. {explanation} "
            "Fix the code, not the tests.")


def _issue_parts(entry: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(head, hint, tail) of an issue text written by :func:`problem_statement`, else None."""
    text = entry.get("problem_statement")
    f2p, repo = entry.get("FAIL_TO_PASS"), entry.get("repo")
    if not isinstance(text, str) or not isinstance(f2p, list) or not isinstance(repo, str):
        return None
    head, tail = problem_statement(repo, [str(t) for t in f2p], "\0").split("\0")
    if not (text.startswith(head) and text.endswith(tail)) or len(text) < len(head) + len(tail):
        return None
    return head, text[len(head):len(text) - len(tail)], tail


def hint_of(entry: Mapping[str, Any]) -> str | None:
    """The modifier's hint sentence inside ``entry``'s issue text (the
    ``explanation`` of :func:`problem_statement`), or None when the text was
    not written by it (e.g. a SWE-bench issue)."""
    parts = _issue_parts(entry)
    return None if parts is None else parts[1]


def with_hint(entry: Mapping[str, Any], hint: str) -> str | None:
    """``entry``'s issue text with its hint sentence replaced by ``hint`` ("" drops
    it), or None when :func:`hint_of` finds none."""
    parts = _issue_parts(entry)
    if parts is None:
        return None
    head, _, tail = parts
    return head + hint + tail if hint else head.rstrip(" ") + tail


def build_repo_tasks(base: BaseRepo, *, seed: int, n: int, max_candidates: int | None = None,
                     progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Up to ``n`` validated task entries of one base repository (see module
    docstring), trying at most ``max_candidates`` bugs (default ``4 n + 8``).
    Raises RuntimeError if the original tests do not run."""
    original = run_tests(base.files, base.spec)
    p0 = original.passed()
    if not p0 or not original.complete:
        raise RuntimeError(f"{base.name}: no test passes on the original tree "
                           f"(exit {original.returncode}): {original.output[-1500:]}")
    out: list[dict[str, Any]] = []
    cap = max_candidates if max_candidates is not None else 4 * n + 8
    bugs = generate_bugs(base.files, base.src_dirs, seed=seed,
                         max_changed_lines=base.max_changed_lines,
                         min_complexity=base.min_complexity)
    for bug in itertools.islice(bugs, cap):
        if len(out) >= n:
            break
        bugged = dict(base.files)
        bugged[bug.path] = bug.after
        run = run_tests(bugged, base.spec)
        now = run.passed()
        f2p, p2p = sorted(p0 - now), sorted(p0 & now)
        if not run.complete or not f2p:
            # A bug that hangs the suite is caught by the CPU budget, which
            # does not depend on the machine's load (a wall-clock limit made
            # rebuilds on a loaded machine differ).
            _say(progress, f"{base.name}: {bug.modifier} rejected "
                           f"({'no test fails' if run.complete else 'run did not complete'})")
            continue
        digest = hashlib.sha256(bug.path.encode() + b"\0" + bug.after).hexdigest()[:10]
        entry = {
            "instance_id": f"{base.name}__{bug.modifier}__{digest}",
            "repo": base.name, "base": base.base, "base_commit": tree_hash(base.files),
            "bug": {"path": bug.path, **splice(base.files[bug.path], bug.after)},
            "patch": unified_diff({bug.path: bug.after}, {bug.path: base.files[bug.path]}),
            "test_patch": "", "src_dirs": list(base.src_dirs),
            "modifier": bug.modifier, "entity": bug.entity,
            "problem_statement": problem_statement(base.name, f2p, bug.explanation),
            "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "test_spec": base.spec.to_json(),
        }
        facts = oracle_check(entry, bugged)
        if facts["correct"] != 1.0:
            _say(progress, f"{base.name}: {bug.modifier} rejected (oracle scored {facts})")
            continue
        _say(progress, f"{base.name}: {entry['instance_id']} ok ({len(f2p)} fail)")
        out.append(entry)
    return out


def oracle_check(entry: Mapping[str, Any], bugged: Mapping[str, bytes]) -> dict[str, Any]:
    """Applies the entry's ``patch`` (git apply, in the sandbox) to ``bugged``
    and grades the result; returns the grading facts."""
    from sao.envs.swe.workspace import execute_files
    res, fixed = execute_files(bugged, "git apply --whitespace=nowarn /tmp/sao_fix.patch",
                               extra_files={"sao_fix.patch": entry["patch"].encode()})
    if res.returncode != 0:
        return {"correct": 0.0, "error": f"git apply failed: {res.output[-500:]}"}
    return grade_files(entry, bugged, fixed)


def cache_key(bases: Iterable[BaseRepo], *, seed: int, per_repo: int) -> str:
    """Content hash of a tier build's inputs."""
    try:
        from importlib.metadata import version
        swesmith = version("swesmith")
    except Exception:  # noqa: BLE001 - not installed: the build fails later with a clear error
        swesmith = "absent"
    parts = [BUILD_VERSION, swesmith, seed, per_repo]
    parts += [[b.name, b.base, tree_hash(b.files), list(b.src_dirs), b.spec.to_json(),
               b.max_changed_lines, b.min_complexity] for b in bases]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def build_tier(tier: str, *, seed: int = 0, per_repo: int | None = None,
               cache: pathlib.Path | None = None,
               download: bool = True, use_cache: bool = True,
               repos: Iterable[str] | None = None,
               progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """All validated task entries of ``tier``, ``per_repo`` per base
    repository at most (default ``DEFAULT_PER_REPO[tier]``), read from the
    cache when built before; ``repos``
    restricts the build to those base repositories (their entries equal the
    full tier's entries of the same repositories).

    Raises SourceUnavailableError if a source sdist is missing offline,
    RuntimeError if a base's tests do not run, ValueError on an unknown repo.
    """
    from sao.envs.swe.sources import cache_root
    bases = tier_bases(tier, download=download)
    per_repo = DEFAULT_PER_REPO[tier] if per_repo is None else per_repo
    if repos is not None:
        wanted = set(repos)
        unknown = wanted - {b.name for b in bases}
        if unknown:
            raise ValueError(f"unknown {tier} repositories {sorted(unknown)}")
        bases = [b for b in bases if b.name in wanted]
    key = cache_key(bases, seed=seed, per_repo=per_repo)
    path = (cache or cache_root()) / "tasks" / f"{tier}-{key}.json"
    if use_cache and path.exists():
        return json.loads(path.read_text())
    start = time.monotonic()
    entries = []
    for base in bases:
        entries += build_repo_tasks(base, seed=seed, n=per_repo, progress=progress)
    _say(progress, f"{tier}: {len(entries)} tasks in {time.monotonic() - start:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
    tmp.replace(path)
    return entries


def split_entries(entries: Iterable[Mapping[str, Any]], *, heldout_fraction: float,
                  seed: int = 0) -> tuple[list[dict], list[dict]]:
    """``(train, heldout)``: an entry is held out when a seeded blake2b hash of
    its ``instance_id`` falls below ``heldout_fraction`` (order-independent)."""
    if not 0.0 <= heldout_fraction <= 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1], got {heldout_fraction}")
    train, held = [], []
    for e in entries:
        h = hashlib.blake2b(f"{seed}/{e['instance_id']}".encode(), digest_size=8).digest()
        (held if int.from_bytes(h, "big") / 2 ** 64 < heldout_fraction else train).append(dict(e))
    return train, held


def _say(progress: Callable[[str], None] | None, msg: str) -> None:
    log.info(msg)
    if progress is not None:
        progress(msg)
