"""``SweTask``: repository tasks as prompt records, graded by their tests.

A record is ``make_prompt(instance_id, name, problem_statement, entry)``
with the task entry (SWE-bench fields plus ``base`` / ``bug`` /
``test_spec``; docs/envs.md) as ``entry``. ``grade(answer, entry)`` treats
the answer as a patch (unified diff, as SWE-bench's ``model_patch``): it is
applied with ``git apply`` in a sandbox to the starting repository and graded
like an episode's working copy. ``SweEnv`` grades the working copy directly.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from sao.envs.base import Task, make_prompt
from sao.envs.swe.repos import start_files
from sao.envs.swe.testrun import grade_files
from sao.envs.swe.workspace import execute_files


def grade_patch(entry: Mapping[str, Any], patch: str) -> dict[str, Any]:
    """Grading facts (``correct``, ``tests_passed``, ...) of ``patch`` applied
    to the entry's starting repository; ``correct`` 0.0 with ``error`` when
    the patch does not apply."""
    start = start_files(entry)
    if not patch.strip():
        work = start
    else:
        res, work = execute_files(start, "git apply --whitespace=nowarn /tmp/sao_model.patch",
                                  extra_files={"sao_model.patch": patch.encode()})
        if res.returncode != 0:
            return {"correct": 0.0, "error": "patch does not apply: " + res.output[-300:]}
    return grade_files(entry, start, work)


class SweTask(Task):
    """Repository tasks from a list of entries.

    Args:
      name: the task name (``"swe/micro"``, ``"swe/source"``, ``"swe/bench"``).
      entries: task entries (``build_tier`` or ``load_instances``).

    Raises ValueError on an entry without the required fields or a duplicate id.
    """

    REQUIRED = ("instance_id", "base", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS")

    def __init__(self, name: str, entries: Sequence[Mapping[str, Any]]):
        self.name = name
        seen = set()
        for e in entries:
            missing = [k for k in self.REQUIRED if k not in e]
            if missing:
                raise ValueError(f"{name}: entry {e.get('instance_id')!r} lacks {missing}")
            if e["instance_id"] in seen:
                raise ValueError(f"{name}: duplicate instance_id {e['instance_id']!r}")
            seen.add(e["instance_id"])
        self.entries = [dict(e) for e in entries]

    def records(self) -> list[dict[str, Any]]:
        return [make_prompt(f"{self.name}/{e['instance_id']}", self.name,
                            e["problem_statement"], e) for e in self.entries]

    def grade(self, answer: str, entry: Any) -> float:
        return float(grade_patch(entry, answer)["correct"])


def make_swe_task(spec: str, *, seed: int = 0, per_repo: int | None = None, split: str = "all",
                  heldout_fraction: float = 0.25, path: str | None = None,
                  checkouts: str | None = None, download: bool = True) -> SweTask:
    """Builds ``swe/micro`` or ``swe/source`` (``build_tier``: ``seed``,
    ``per_repo`` tasks per base repository (default: micro 4, source 5),
    ``split`` ``"all"``, ``"train"`` or ``"heldout"`` by ``split_entries``)
    or ``swe/bench`` (SWE-bench instances from the JSON / JSONL file
    ``path``, checkouts under ``checkouts``). Raises ValueError on an unknown spec or split."""
    from sao.envs.swe.build import build_tier, split_entries
    if split not in ("all", "train", "heldout"):
        raise ValueError(f"split must be 'all', 'train' or 'heldout', got {split!r}")
    if spec in ("swe/micro", "swe/source"):
        entries = build_tier(spec[4:], seed=seed, per_repo=per_repo, download=download)
    elif spec == "swe/bench":
        from sao.envs.swe.swebench import load_instances
        if path is None or checkouts is None:
            raise ValueError("swe/bench needs path= (instances) and checkouts= (git checkouts)")
        entries = load_instances(path, checkouts)
    else:
        raise ValueError(f"unknown SWE task spec {spec!r}; expected swe/micro, swe/source, "
                         "swe/bench")
    if split != "all":
        train, held = split_entries(entries, heldout_fraction=heldout_fraction, seed=seed)
        entries = train if split == "train" else held
    return SweTask(spec, entries)
