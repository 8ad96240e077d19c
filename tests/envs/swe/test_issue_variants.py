"""Issue-text variants of the SWE SFT demonstrations (sao.data.swe_demos)."""
from __future__ import annotations

import random

from sao.data.swe_demos import issue_variants, swe_sft_demos
from sao.envs.swe.build import hint_of, problem_statement, with_hint


def test_hint_round_trips_through_the_issue_text():
    entry = {"repo": "calc", "FAIL_TO_PASS": ["t.py::a", "t.py::b", "t.py::c", "t.py::d"],
             "problem_statement": problem_statement("calc", ["t.py::a", "t.py::b", "t.py::c",
                                                             "t.py::d"], "A hint.")}
    assert hint_of(entry) == "A hint."
    assert with_hint(entry, "Other.") == problem_statement("calc", entry["FAIL_TO_PASS"], "Other.")
    assert with_hint(entry, "") == ("Tests fail in calc: t.py::a, t.py::b, t.py::c and 1 more. "
                                    "Fix the code, not the tests.")
    # Not written by problem_statement (a SWE-bench issue), or malformed fields: no hint.
    assert hint_of({**entry, "problem_statement": "Crash in parser."}) is None
    assert hint_of({**entry, "FAIL_TO_PASS": None}) is None
    assert with_hint({"problem_statement": 3}, "x") is None


def test_variants_change_only_the_hint(micro_entries):
    records = [{"task": "swe/micro", "prompt_id": e["instance_id"], "entry": e}
               for e in micro_entries]
    base = swe_sft_demos(records, task="swe/micro", fmt="tags", limit=10)
    demos = swe_sft_demos(records, task="swe/micro", fmt="tags", limit=10,
                          issue_variants_per_task=3, seed=0)
    hints = {hint_of(e) for e in micro_entries}
    assert len(base) == 2
    # One other training hint and "no hint" are all there is to draw from here.
    assert len(demos) == 2 + 2 * min(3, len(hints - {None}))
    originals = [d for d in demos if d in base]
    assert originals == base
    for demo in demos:
        orig = next(b for b in base if b.spans == demo.spans)   # commands, observations unchanged
        entry = micro_entries[base.index(orig)]
        if demo == orig:
            continue
        assert demo.prompt != orig.prompt
        assert entry["problem_statement"] not in demo.prompt
        assert any(demo.prompt == orig.prompt.replace(entry["problem_statement"],
                                                      with_hint(entry, h))
                   for h in sorted(hints - {hint_of(entry)}) + [""])
    # The same seed draws the same variants.
    again = swe_sft_demos(records, task="swe/micro", fmt="tags", limit=10,
                          issue_variants_per_task=3, seed=0)
    assert [d.prompt for d in again] == [d.prompt for d in demos]


def test_an_issue_without_a_hint_gets_no_variant(micro_entries):
    entry = {**micro_entries[0], "problem_statement": "Something is off."}
    demo = type("D", (), {"prompt": "Something is off.\nTools..."})()
    assert issue_variants(demo, entry, ["A.", "B."], 2, random.Random(0)) == []


def test_rl_prompt_variants_keep_the_task_and_change_the_text(micro_entries):
    from sao.data.swe_demos import issue_variant_records
    from sao.envs.base import make_prompt
    records = [make_prompt(f"swe/micro/{e['instance_id']}", "swe/micro", e["problem_statement"], e)
               for e in micro_entries]
    assert issue_variant_records(records, 0) == records
    out = issue_variant_records(records, 3, seed=0)
    assert len({r["prompt_id"] for r in out}) == len(out) > len(records)
    for r in out:
        orig = next(o for o in records if r["prompt_id"].startswith(o["prompt_id"]))
        assert r["entry"] == orig["entry"] and r["task"] == orig["task"]   # same bug and grading
        if r["prompt_id"] != orig["prompt_id"]:
            assert r["text"] != orig["text"] and r["prompt_id"].startswith(orig["prompt_id"] + "#hint")
    # An excluded text is never drawn, and a record whose text is not its issue is kept alone.
    banned = {r["text"] for r in out if r["prompt_id"].endswith("#hint0")}
    again = issue_variant_records(records, 3, seed=0, exclude_texts=banned)
    assert not banned & {r["text"] for r in again if "#hint" in r["prompt_id"]}
    odd = [dict(records[0], text="Other words.")]
    assert issue_variant_records(odd, 3) == odd
