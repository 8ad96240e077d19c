"""SFT data for repository tasks: the scripted fixes of the training split.

``swe_sft_demos`` runs ``sao.envs.swe.demos.demonstration`` (a real ``SweEnv``
episode that looks at the file, puts the original line back and submits)
for each training record of one task, skipping an entry whose scripted
episode fails (not a one-line bug; a command past its timeout on a loaded
machine) with a logged reason, so one slow sandbox call cannot fail a run's
warm start.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence


def swe_sft_demos(records: Sequence[Mapping], *, task: str, fmt: str, limit: int,
                  log: Callable[[str], None] = print) -> list:
    """Demonstrations (``sao.data.demonstrations.Demonstration``) of the records of
    ``task``, at most ``limit``, in format ``fmt``. Raises ValueError if none succeeds."""
    from sao.envs.swe.demos import demonstration
    demos = []
    for r in records:
        if r["task"] != task or len(demos) >= limit:
            continue
        try:
            demos.append(demonstration(r["entry"], fmt=fmt, task_name=task))
        except ValueError as e:
            log(f"SFT: no demonstration of {r['prompt_id']}: {str(e)[:200]}")
    if not demos:
        raise ValueError(f"no demonstration of {task} succeeded")
    return demos
