"""Scripted demonstrations on repository tasks, for an SFT warm start.

A demonstration is a real episode of ``SweEnv`` driven by a script that
knows the fix (the one-line bug of a micro task): look at the file, replace
the bugged line with the original (``sed -i 'Nc\\...'``), submit::

    <python>cat calc.py</python>              action
    <output>def add(a, b): ...</output>       observation (what the env returned)
    <python>sed -i '18c\\    return n % 2 == 0' calc.py</python>
    <output></output>
    <answer>done</answer>                     submit: graded, must score 1

The observations are the env's own outputs, framed as the agent loop frames
them (``tags``: ``<output>...</output>``; ``hermes``: the ChatML
``<tool_response>`` turn), so the token stream matches an RL episode. The
result uses ``sao.data.demonstrations.Demonstration`` (prompt, spans with
``is_action``), the type the quick start's SFT tokenises.
"""
from __future__ import annotations

import json
import shlex
from typing import Any, Mapping, Sequence

from sao.data.demonstrations import Demonstration
from sao.envs.swe.env import SweEnv
from sao.envs.swe.task import SweTask
from sao.envs.tool_env import EpisodeConfig

_FRAMES = {
    "tags": ("<output>", "</output>"),
    "hermes": ("\n<|im_start|>user\n<tool_response>\n",
               "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
}


def fix_commands(entry: Mapping[str, Any]) -> list[str]:
    """Bash commands that fix a one-line bug: show the file, put the original
    line back. Raises ValueError for a bug that is not a one-line change."""
    bug = entry.get("bug") or {}
    if len(bug.get("old", ())) != 1 or len(bug.get("new", ())) != 1:
        raise ValueError(f"{entry.get('instance_id')}: not a one-line bug")
    line = bug["old"][0].rstrip("\n").replace("\\", "\\\\")
    script = f"{int(bug['start']) + 1}c\\{line}"
    return [f"cat {bug['path']}", f"sed -i {shlex.quote(script)} {bug['path']}"]


def _action(tool: str, args: dict, fmt: str) -> str:
    if fmt == "tags":
        return "<answer>done</answer>" if tool == "submit" else f"<python>{args['command']}</python>"
    call = json.dumps({"name": tool, "arguments": args})
    return f"<tool_call>\n{call}\n</tool_call><|im_end|>"


def demonstration(entry: Mapping[str, Any], *, fmt: str = "tags", task_name: str = "swe/micro",
                  config: EpisodeConfig | None = None) -> Demonstration:
    """Runs the scripted fix of ``entry`` through ``SweEnv`` and records it.

    Raises ValueError if the entry is not a one-line bug or the episode does
    not earn reward 1 (a demonstration is always correct).
    """
    task = SweTask(task_name, [entry])
    cfg = config or EpisodeConfig(tool_format=fmt, max_turns=8, max_tool_calls=6,
                                  tool_timeout_s=30.0, max_observation_chars=2000)
    env = SweEnv(task, cfg)
    prompt = env.reset(task.records()[0])
    prefix, suffix = _FRAMES[fmt]
    spans: list[tuple[str, bool]] = []
    for command in fix_commands(entry):
        action = _action("bash", {"command": command}, fmt)
        res = env.step(action)
        if res.done:
            raise ValueError(f"{entry['instance_id']}: episode ended early ({res.info})")
        spans += [(action, True), (prefix + res.observation_text + suffix, False)]
    action = _action("submit", {}, fmt)
    res = env.step(action)
    if res.reward != 1.0:
        raise ValueError(f"{entry['instance_id']}: scripted fix scored {res.reward} ({res.info})")
    spans.append((action, True))
    return Demonstration(prompt=prompt, spans=tuple(spans), uses_tool=True, answer="done")


def swe_demonstrations(entries: Sequence[Mapping[str, Any]], *, fmt: str = "tags",
                       task_name: str = "swe/micro") -> list[Demonstration]:
    """One demonstration per one-line-bug entry (others are skipped), in order."""
    out = []
    for entry in entries:
        bug = entry.get("bug") or {}
        if len(bug.get("old", ())) == 1 and len(bug.get("new", ())) == 1:
            out.append(demonstration(entry, fmt=fmt, task_name=task_name))
    return out
