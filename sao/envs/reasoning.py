"""Tool-integrated arithmetic / math tasks from ``reasoning-gym`` and free-form math.

``ReasoningGymTask`` generates procedurally (offline, deterministic per seed)
any reasoning-gym dataset, e.g. ``basic_arithmetic``, ``chain_sum``,
``gsm_symbolic``, ``countdown``; answers are graded by the dataset's own
``score_answer`` (countdown gives 0.01 for a well-formed wrong answer), or by
math-verify (``grader="math_verify"``). ``MathTask`` holds given
question/answer pairs graded by math-verify.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from sao.envs.base import Task, make_prompt
from sao.envs.math_grader import math_verify_score

GRADERS = ("dataset", "math_verify")


class ReasoningGymTask(Task):
    """A reasoning-gym dataset as a task.

    Args:
      dataset: reasoning-gym dataset name (``rg.create_dataset`` name).
      size: number of generated items (>= 1; default 1000).
      seed: generation seed (same seed, same items).
      config: extra dataset config (difficulty ranges, ...), JSON-able.
      grader: ``"dataset"`` (the dataset's ``score_answer``) or ``"math_verify"``.
      name: task name in the records (default ``"rg/<dataset>"``).

    Records: ``prompt_id = "<name>/<seed>/<index>"``, ``text`` = the question,
    ``entry`` = the reasoning-gym entry (question, answer, metadata).
    Raises ValueError on an unknown dataset or grader, or size < 1.
    """

    def __init__(self, dataset: str, *, size: int = 1000, seed: int = 0,
                 config: Mapping[str, Any] | None = None, grader: str = "dataset",
                 name: str | None = None):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        if grader not in GRADERS:
            raise ValueError(f"unknown grader {grader!r}; expected one of {GRADERS}")
        self.dataset, self.size, self.seed = dataset, int(size), int(seed)
        self.config = dict(config or {})
        self.grader = grader
        self.name = name or f"rg/{dataset}"
        self._records: list[dict[str, Any]] | None = None

    def records(self) -> list[dict[str, Any]]:
        if self._records is None:
            import reasoning_gym  # heavy import (~3 s): only when used
            try:
                ds = reasoning_gym.create_dataset(self.dataset, size=self.size, seed=self.seed,
                                                  **self.config)
            except Exception as e:
                raise ValueError(f"reasoning-gym cannot create {self.dataset!r}: {e}") from e
            self._records = [
                make_prompt(f"{self.name}/{self.seed}/{i}", self.name, entry["question"],
                            json.loads(json.dumps(entry, default=str)))
                for i, entry in enumerate(ds)]
        return self._records

    def grade(self, answer: str, entry: Mapping[str, Any]) -> float:
        """Score in [0, 1]; a grader error scores 0."""
        if self.grader == "math_verify":
            return math_verify_score(answer, str(entry["answer"]))
        import reasoning_gym
        try:
            score_fn = reasoning_gym.get_score_answer_fn(entry["metadata"]["source_dataset"])
            return float(score_fn(answer, dict(entry)))
        except Exception:
            return 0.0

    def instructions(self) -> str:
        return "Answer with the final result only."


class MathTask(Task):
    """Free-form math questions with reference answers, graded by math-verify.

    Args:
      name: task name.
      items: ``[{"question": str, "answer": str}, ...]`` (extra keys are kept
        in the entry).

    Raises ValueError if an item lacks ``question`` or ``answer``.
    """

    def __init__(self, name: str, items: Sequence[Mapping[str, Any]]):
        self.name = name
        for i, item in enumerate(items):
            if not isinstance(item.get("question"), str) or "answer" not in item:
                raise ValueError(f"item {i} needs 'question' (str) and 'answer'")
        self._records = [make_prompt(f"{name}/{i}", name, item["question"], dict(item))
                         for i, item in enumerate(items)]

    def records(self) -> list[dict[str, Any]]:
        return self._records

    def grade(self, answer: str, entry: Mapping[str, Any]) -> float:
        return math_verify_score(answer, str(entry["answer"]))

    def instructions(self) -> str:
        return "Put the final result in the answer, in LaTeX if needed."
