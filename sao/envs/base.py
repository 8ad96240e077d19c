"""The environment interface: prompts, tasks, episodes (docs/envs.md).

* A **prompt record** is a small JSON-able dict ``{"prompt_id", "task",
  "text", "entry"}``: ``text`` is the question shown to the policy, ``entry``
  is whatever the task's grader needs (reference answer, tests, metadata).
* A ``Task`` turns its data into prompt records and grades a final answer
  against a record's ``entry``.
* An ``Env`` runs one episode: ``reset(prompt) -> prompt text``, then
  ``step(action_text) -> StepResult`` after every policy turn. The agent loop
  (sao/rollout/agent.py) tokenises the prompt text once and frames each
  ``observation_text`` in the model's tool-output markers.
"""
from __future__ import annotations

import abc
import dataclasses
import json
from typing import Any, Iterable, Mapping

PROMPT_KEYS = ("prompt_id", "task", "text", "entry")


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What the environment answers to one policy turn.

    Attributes:
      observation_text: tool output to append (the agent loop frames it), or
        None when the episode ends.
      done: the episode is over (an answer was given, or a limit was hit).
      reward: scalar outcome reward; meaningful when ``done``.
      info: JSON-able facts (tool calls, correctness, style, errors, ...).
    """

    observation_text: str | None
    done: bool
    reward: float = 0.0
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


def make_prompt(prompt_id: str, task: str, text: str, entry: Any) -> dict[str, Any]:
    """A validated prompt record; raises ValueError if a field is empty or
    ``entry`` is not JSON-serialisable."""
    if not prompt_id or not isinstance(prompt_id, str):
        raise ValueError(f"prompt_id must be a non-empty str, got {prompt_id!r}")
    if not task or not isinstance(task, str):
        raise ValueError(f"task must be a non-empty str, got {task!r}")
    if not isinstance(text, str) or not text:
        raise ValueError(f"prompt {prompt_id}: text must be a non-empty str")
    try:
        json.dumps(entry)
    except (TypeError, ValueError) as e:
        raise ValueError(f"prompt {prompt_id}: entry is not JSON-serialisable: {e}") from e
    return {"prompt_id": prompt_id, "task": task, "text": text, "entry": entry}


def check_prompt(prompt: Mapping[str, Any]) -> Mapping[str, Any]:
    """Returns ``prompt`` if it has the record keys; raises ValueError otherwise."""
    if not isinstance(prompt, Mapping) or any(k not in prompt for k in PROMPT_KEYS):
        raise ValueError(f"a prompt record needs keys {PROMPT_KEYS}, got {prompt!r:.200}")
    return prompt


class Task(abc.ABC):
    """A source of prompts with a grader.

    Attributes:
      name: the task name stored in every record (``prompt["task"]``).
    """

    name: str

    @abc.abstractmethod
    def records(self) -> list[dict[str, Any]]:
        """All prompt records of this task (deterministic for a given config)."""

    @abc.abstractmethod
    def grade(self, answer: str, entry: Any) -> float:
        """Correctness of a final ``answer`` for the record ``entry``, in [0, 1]."""

    def instructions(self) -> str:
        """Task-specific answer instructions appended to the question."""
        return ""


class Env(abc.ABC):
    """One episode at a time; create one Env per concurrent episode."""

    @abc.abstractmethod
    def reset(self, prompt: Mapping[str, Any]) -> str:
        """Starts an episode for a prompt record; returns the prompt text.

        Raises ValueError on a malformed record.
        """

    @abc.abstractmethod
    def step(self, action_text: str) -> StepResult:
        """Consumes one decoded policy turn; raises RuntimeError before reset."""


def iter_records(tasks: Iterable[Task]) -> list[dict[str, Any]]:
    """Concatenated records of several tasks; raises ValueError on a duplicate id."""
    seen: set[str] = set()
    out = []
    for task in tasks:
        for rec in task.records():
            if rec["prompt_id"] in seen:
                raise ValueError(f"duplicate prompt_id {rec['prompt_id']!r}")
            seen.add(rec["prompt_id"])
            out.append(rec)
    return out
