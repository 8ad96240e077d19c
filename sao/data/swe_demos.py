"""SFT data for repository tasks: the scripted fixes of the training split.

``swe_sft_demos`` runs ``sao.envs.swe.demos.demonstration`` (a real ``SweEnv``
episode that looks at the file, puts the original line back and submits)
for each training record of one task, skipping an entry whose scripted
episode fails (not a one-line bug; a command past its timeout on a loaded
machine) with a logged reason, so one slow sandbox call cannot fail a run's
warm start.

**Issue-text variants** (``issue_variants=k``): an issue of the micro and
source tiers names the failing tests and adds the bug modifier's hint
sentence (``sao.envs.swe.build.problem_statement``). With one demonstration
per task a small model learns each whole issue text by heart and reads a new
one badly: the same failing test with another hint is a text it has never
seen (docs/envs.md, the ``cpu_long`` run). Each demonstration is therefore
repeated ``k`` times with the hint replaced by another hint drawn from the
*training* tasks (or left out), and nothing else changed: the same commands,
observations and submit. Only training tasks are read; a held-out task's text
is never shown.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Callable, Mapping, Sequence


def issue_variants(demo, entry: Mapping, hints: Sequence[str], k: int, rng: random.Random) -> list:
    """``k`` copies of ``demo`` whose prompt carries ``entry``'s issue with its hint
    sentence replaced by one of ``hints`` (or by none), each hint at most once.
    Returns [] when the entry's issue has no hint (``build.hint_of``) or does not
    occur exactly once in the prompt."""
    from sao.envs.swe.build import hint_of, with_hint
    own, text = hint_of(entry), entry.get("problem_statement", "")
    if own is None or demo.prompt.count(text) != 1:
        return []
    others = sorted({h for h in hints if h != own}) + [""]
    out = []
    for hint in rng.sample(others, min(k, len(others))):
        prompt = demo.prompt.replace(text, with_hint(entry, hint), 1)
        out.append(dataclasses.replace(demo, prompt=prompt))
    return out


def swe_sft_demos(records: Sequence[Mapping], *, task: str, fmt: str, limit: int,
                  log: Callable[[str], None] = print, issue_variants_per_task: int = 0,
                  seed: int = 0) -> list:
    """Demonstrations (``sao.data.demonstrations.Demonstration``) of the records of
    ``task``, at most ``limit`` scripted episodes, in format ``fmt``; with
    ``issue_variants_per_task`` = k > 0, each followed by its k issue-text variants
    (:func:`issue_variants`, hints of these records only, drawn with ``seed``).
    Raises ValueError if none succeeds."""
    from sao.envs.swe.build import hint_of
    from sao.envs.swe.demos import demonstration
    demos, done = [], []
    for r in records:
        if r["task"] != task or len(done) >= limit:
            continue
        try:
            demo = demonstration(r["entry"], fmt=fmt, task_name=task)
        except ValueError as e:
            log(f"SFT: no demonstration of {r['prompt_id']}: {str(e)[:200]}")
            continue
        done.append((demo, r["entry"]))
    if not done:
        raise ValueError(f"no demonstration of {task} succeeded")
    hints = [h for _, e in done if (h := hint_of(e)) is not None]
    rng = random.Random(seed)
    for demo, entry in done:
        demos.append(demo)
        if issue_variants_per_task > 0:
            demos += issue_variants(demo, entry, hints, issue_variants_per_task, rng)
    return demos
