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
seen (docs/swe_cpu_runs.md, the ``cpu_long`` runs). Each demonstration is therefore
repeated ``k`` times with the hint replaced by another hint drawn from the
*training* tasks (or left out), and nothing else changed: the same commands,
observations and submit. Only training tasks are read; a held-out task's text
is never shown, and a variant whose text equals a held-out task's issue
(``exclude_texts``: the same failing test under that task's hint, a text the
micro tier's short issues make likely) is never made: such a variant would
show a held-out issue beside the fix of a training bug on the same line,
which is often the held-out fix itself.

``issue_variant_records`` does the same for the RL prompts (``data.issue_variants``):
each training record of a repository task is joined by ``k`` records with the same
task entry (the same bug, tests and grading) and the issue text under another
training hint, so RL rewards a fix under the texts the warm start showed it,
not under its one original hint alone.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Callable, Collection, Mapping, Sequence


def variant_texts(entry: Mapping, hints: Sequence[str], k: int, rng: random.Random,
                  exclude_texts: Collection[str] = ()) -> list[str]:
    """Up to ``k`` issue texts of ``entry``, its hint sentence replaced by one of
    ``hints`` other than its own (or by none), each at most once, drawn with ``rng``;
    a text in ``exclude_texts`` is never returned. [] when the issue has no hint
    (``sao.envs.swe.build.hint_of``)."""
    from sao.envs.swe.build import hint_of, with_hint
    own = hint_of(entry)
    if own is None:
        return []
    texts = sorted({with_hint(entry, h) for h in hints if h != own} | {with_hint(entry, "")})
    texts = [t for t in texts if t not in exclude_texts and t != entry.get("problem_statement")]
    return rng.sample(texts, min(k, len(texts)))


def issue_variants(demo, entry: Mapping, hints: Sequence[str], k: int, rng: random.Random,
                   exclude_texts: Collection[str] = ()) -> list:
    """``k`` copies of ``demo`` whose prompt carries one of :func:`variant_texts` in place
    of ``entry``'s issue. Returns [] when the issue has no hint or does not occur exactly
    once in the prompt."""
    text = entry.get("problem_statement", "")
    if not text or demo.prompt.count(text) != 1:
        return []
    return [dataclasses.replace(demo, prompt=demo.prompt.replace(text, t, 1))
            for t in variant_texts(entry, hints, k, rng, exclude_texts)]


def swe_sft_demos(records: Sequence[Mapping], *, task: str, fmt: str, limit: int,
                  log: Callable[[str], None] = print, issue_variants_per_task: int = 0,
                  seed: int = 0, exclude_texts: Collection[str] = ()) -> list:
    """Demonstrations (``sao.data.demonstrations.Demonstration``) of the records of
    ``task``, at most ``limit`` scripted episodes, in format ``fmt``; with
    ``issue_variants_per_task`` = k > 0, each followed by its k issue-text variants
    (:func:`issue_variants`, hints of these records only, drawn with ``seed``, none of
    ``exclude_texts``: pass the held-out issues). Raises ValueError if none succeeds."""
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
            demos += issue_variants(demo, entry, hints, issue_variants_per_task, rng,
                                    exclude_texts)
    return demos


def issue_variant_records(records: Sequence[Mapping], k: int, seed: int = 0,
                          exclude_texts: Collection[str] = ()) -> list[dict]:
    """``records`` (prompt records, ``sao.envs.base.make_prompt``) each followed, when
    its text is its entry's issue and that has a hint, by up to ``k`` copies whose
    ``text`` is one of :func:`variant_texts` (hints of these records, drawn with ``seed``,
    none of ``exclude_texts``: pass the held-out issues); a copy's ``prompt_id`` is the
    record's with ``#hint<j>`` appended, its ``entry`` the record's own (the same bug,
    tests and grading). With ``k`` = 0 the records pass unchanged."""
    from sao.envs.swe.build import hint_of
    if k <= 0:
        return list(records)
    entries = [r["entry"] for r in records if isinstance(r.get("entry"), Mapping)]
    hints = sorted({h for e in entries if (h := hint_of(e)) is not None})
    rng, out = random.Random(seed), []
    for r in records:
        out.append(r)
        entry = r.get("entry")
        if not isinstance(entry, Mapping) or r.get("text") != entry.get("problem_statement"):
            continue
        for j, text in enumerate(variant_texts(entry, hints, k, rng, exclude_texts)):
            out.append(dict(r, prompt_id=f"{r['prompt_id']}#hint{j}", text=text))
    return out
