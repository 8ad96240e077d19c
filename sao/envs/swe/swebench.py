"""SWE-bench instances from local git checkouts.

An instance (one JSON object; a file holds a JSON list or one object per
line) has SWE-bench's fields: ``repo`` (``owner/name``), ``instance_id``,
``base_commit``, ``patch`` (the gold fix), ``test_patch`` (the tests that
check it), ``problem_statement``, ``FAIL_TO_PASS`` and ``PASS_TO_PASS``
(lists of pytest node ids, or JSON strings of lists as in the published
datasets). Optional: ``test_spec`` (``{"pythonpath", "pytest_args",
"test_files", "timeout_s", "plugin_autoload"}``; default: pytest on the files
the test ids name).

The checkout of ``owner/name`` is looked up under the checkouts directory as
``owner__name``, ``name`` or ``owner/name`` (a git repository containing
``base_commit``). The episode starts from the tree at ``base_commit``
(``git archive``; no work tree is touched); grading restores the files of
``test_patch`` and every test / config file, applies ``test_patch`` with
``git apply`` in the sandbox and runs the tests. The sandbox runs them with
this process's Python, so the repository's own dependencies must be
installed in it (SWE-bench's per-repository docker images are not used).

Why not the ``swebench`` package: only its record format is needed here,
its harness package imports docker and modal (a 454 MB install), and its
pytest log parser splits console lines on whitespace (parametrised ids with
spaces collide); outcomes here come from pytest's junit XML.
"""
from __future__ import annotations

import json
import pathlib
import re
from typing import Any, Mapping

FIELDS = ("repo", "instance_id", "base_commit", "patch", "test_patch", "problem_statement",
          "FAIL_TO_PASS", "PASS_TO_PASS")
_DIFF_PATH = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


def patch_paths(patch: str) -> list[str]:
    """Paths a git-style patch touches (both sides), sorted."""
    return sorted({p for m in _DIFF_PATH.finditer(patch) for p in m.groups()})


def _ids(value: Any, field: str, iid: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{iid}: {field} is not a JSON list: {e}") from e
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{iid}: {field} must be a list of test ids")
    return list(value)


def find_checkout(checkouts: str | pathlib.Path, repo: str) -> pathlib.Path:
    """The git checkout of ``owner/name`` under ``checkouts``; raises ValueError if none."""
    root = pathlib.Path(checkouts)
    owner, _, name = repo.partition("/")
    for cand in (root / repo.replace("/", "__"), root / (name or owner), root / repo):
        if (cand / ".git").exists():
            return cand
    raise ValueError(f"no git checkout of {repo!r} under {root} "
                     f"(tried {repo.replace('/', '__')}, {name or owner}, {repo})")


def to_entry(instance: Mapping[str, Any], checkouts: str | pathlib.Path) -> dict[str, Any]:
    """A task entry of one SWE-bench instance; raises ValueError on a missing
    or malformed field or a missing checkout."""
    if not isinstance(instance, Mapping):
        raise ValueError("an instance must be a JSON object")
    iid = str(instance.get("instance_id", "?"))
    missing = [f for f in FIELDS if f not in instance]
    if missing:
        raise ValueError(f"instance {iid}: missing {missing}")
    for f in ("repo", "instance_id", "base_commit", "patch", "test_patch", "problem_statement"):
        if not isinstance(instance[f], str):
            raise ValueError(f"instance {iid}: {f} must be a string")
    if not re.fullmatch(r"[0-9a-fA-F]{7,40}|[\w./-]+", instance["base_commit"]):
        raise ValueError(f"instance {iid}: bad base_commit {instance['base_commit']!r}")
    f2p = _ids(instance["FAIL_TO_PASS"], "FAIL_TO_PASS", iid)
    p2p = _ids(instance["PASS_TO_PASS"], "PASS_TO_PASS", iid)
    if not f2p:
        raise ValueError(f"instance {iid}: FAIL_TO_PASS is empty")
    spec = dict(instance.get("test_spec") or {})
    if not spec.get("test_files"):
        spec["test_files"] = sorted({t.split("::")[0] for t in f2p + p2p})
    checkout = find_checkout(checkouts, instance["repo"])
    return {
        "instance_id": iid, "repo": instance["repo"],
        "base": {"kind": "git", "path": str(checkout.resolve()),
                 "commit": instance["base_commit"]},
        "base_commit": instance["base_commit"], "patch": instance["patch"],
        "test_patch": instance["test_patch"], "problem_statement": instance["problem_statement"],
        "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "test_spec": spec,
        "protected_files": patch_paths(instance["test_patch"]),
    }


def load_instances(path: str | pathlib.Path, checkouts: str | pathlib.Path) -> list[dict]:
    """Task entries of the instances in ``path`` (a JSON list or JSON lines).
    Raises ValueError on a malformed instance (naming it)."""
    text = pathlib.Path(path).read_text()
    stripped = text.lstrip()
    if stripped.startswith("["):
        items = json.loads(stripped)
    else:
        items = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [to_entry(item, checkouts) for item in items]
