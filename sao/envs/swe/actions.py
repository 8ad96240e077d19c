"""The SWE env's tools and how a policy turn calls them.

Tools (OpenAI function schemas in ``TOOL_SCHEMAS``): ``bash`` (``command``),
``str_replace_editor`` (``command`` = view / create / str_replace / insert,
``path``, ...; sao/envs/swe/editor.py) and ``submit`` (no arguments: grade
the working copy now).

* ``"hermes"`` (chat models: Qwen3, SmolLM2)::

      <tool_call>
      {"name": "bash", "arguments": {"command": "pytest -q"}}
      </tool_call>

* ``"tags"`` (the byte-level tiny model, whose tags are single tokens): the
  body of ``<python>...</python>`` is a bash command (the tag keeps its name
  because it is one token of that tokenizer), or a JSON object
  ``{"name": ..., "arguments": ...}`` for the editor; ``<answer>...</answer>``
  submits.

In both formats ``<answer>`` submits; a malformed call (bad JSON, unknown
tool, missing argument) becomes an ``Action`` with ``error`` set.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from sao.envs import tools

BASH, EDITOR, SUBMIT = "bash", "str_replace_editor", "submit"
_ALIASES = {"editor": EDITOR, "str_replace_based_edit_tool": EDITOR}

TOOL_SCHEMAS = [
    {"type": "function", "function": {
        "name": BASH,
        "description": ("Runs a bash command in the repository (cwd: its root) in a sandbox "
                        "without network, with time and output limits. Files you change "
                        "persist between calls."),
        "parameters": {"type": "object", "required": ["command"],
                       "properties": {"command": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": EDITOR,
        "description": ("Views, creates and edits files. view: a file with line numbers or a "
                        "directory listing; create: a new file; str_replace: replace old_str "
                        "(must occur exactly once) by new_str; insert: new_str after line "
                        "insert_line (0 = top)."),
        "parameters": {"type": "object", "required": ["command", "path"], "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert"]},
            "path": {"type": "string"}, "file_text": {"type": "string"},
            "old_str": {"type": "string"}, "new_str": {"type": "string"},
            "insert_line": {"type": "integer"},
            "view_range": {"type": "array", "items": {"type": "integer"}}}}}},
    {"type": "function", "function": {
        "name": SUBMIT,
        "description": "Ends the episode: the repository's tests grade your changes.",
        "parameters": {"type": "object", "properties": {}}}},
]

_PY_RE = re.compile(r"<python>(.*?)</python>", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Action:
    """A parsed turn: ``tool`` (``bash``, ``str_replace_editor``, ``submit``)
    with ``args``, or ``error`` (a malformed call), or neither (no call)."""

    tool: str | None = None
    args: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None


def parse_action(text: str, fmt: str) -> Action:
    """Parses a decoded policy turn in format ``fmt`` (``"tags"`` / ``"hermes"``)."""
    tools.check_format(fmt)
    if _ANSWER_RE.search(text):
        return Action(SUBMIT)
    if fmt == "tags":
        blocks = _PY_RE.findall(text)
        if not blocks:
            return Action()
        body = blocks[-1]
        if body.lstrip().startswith("{"):
            try:
                call = json.loads(body)
            except json.JSONDecodeError:
                call = None
            if isinstance(call, dict) and "name" in call:
                return _call(call)
        return Action(BASH, {"command": body})
    calls = _TOOL_CALL_RE.findall(text)
    if not calls:
        return Action()
    try:
        call = json.loads(calls[-1].strip())
    except json.JSONDecodeError as e:
        return Action(error=f"tool call is not valid JSON: {e}")
    return _call(call)


def _call(call: Any) -> Action:
    if not isinstance(call, dict):
        return Action(error="a tool call must be a JSON object")
    name = _ALIASES.get(call.get("name"), call.get("name"))
    args = call.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            return Action(error=f"tool arguments are not valid JSON: {e}")
    if not isinstance(args, dict):
        return Action(error="tool arguments must be a JSON object")
    if name == BASH:
        if not isinstance(args.get("command"), str):
            return Action(error='bash needs {"command": "<command line>"}')
        return Action(BASH, {"command": args["command"]})
    if name in (EDITOR, SUBMIT):
        return Action(name, args)
    return Action(error=f"unknown tool {call.get('name')!r}; the tools are {BASH}, {EDITOR}, "
                        f"{SUBMIT}")


def render_output(output: str, *, returncode: int | None, timed_out: bool, truncated: bool,
                  error: str | None, max_chars: int) -> str:
    """Observation text of a bash call: output, then notes (``[exit status N]``,
    ``[timed out]``, ``[output truncated]``, the error), reserved markup
    defused, cut to ``max_chars`` keeping the head and the tail."""
    notes = [n for n in ("[timed out]" if timed_out else "",
                         "[output truncated]" if truncated else "",
                         f"[exit status {returncode}]" if returncode not in (0, None) else "",
                         f"[{error}]" if error else "") if n]
    return clip(tools.sanitize(output.rstrip("\n")), " ".join(notes), max_chars)


def clip(text: str, note: str, max_chars: int) -> str:
    """``text`` + newline + ``note`` in at most ``max_chars`` characters (the
    middle of ``text`` elided)."""
    room = max(0, max_chars - len(note) - 1)
    if len(text) > room:
        marker = "\n[...]\n"
        head = max(0, (room - len(marker)) * 2 // 3)
        tail = max(0, room - len(marker) - head)
        text = text[:head] + marker + (text[-tail:] if tail else "")
    return "\n".join(p for p in (text, note) if p)[:max_chars]


def tool_instructions(fmt: str) -> str:
    """How to use the tools, for the prompt (format ``fmt``)."""
    if tools.check_format(fmt) == "tags":
        return ("Run shell commands in the repository with <python>command</python>; you see "
                "their output in <output></output>. Write <answer>done</answer> to submit.")
    return ("Use the tools to inspect the repository, fix the code and run the tests; "
            "call submit when done.")


def hermes_system_prompt() -> str:
    """The system message listing the tools as Qwen3 / Hermes templates do."""
    listed = "\n".join(json.dumps(s) for s in TOOL_SCHEMAS)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listed}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
