"""Tool-call formats: how the policy calls the Python tool and answers.

Two formats (docs/envs.md):

* ``"tags"`` (tiny byte-level models, whose tags are single tokens)::

      <python>print(17 * 23)</python>      policy turn (stops at </python>)
      <output>391\n</output>               observation (framed by the agent loop)
      <answer>391</answer>                 final answer, ends the episode

* ``"hermes"`` (chat models, Qwen3 / Hermes native tool calls)::

      <tool_call>
      {"name": "python", "arguments": {"code": "print(17 * 23)"}}
      </tool_call>                          assistant turn
      <tool_response>\n391\n</tool_response>  the next (tool) turn, framed by the agent loop
      <answer>391</answer>                  final answer (or the whole last message
                                            when it has no tags, for graders that
                                            extract, e.g. \\boxed{})

A turn that holds an answer is final, even if it also holds a tool call.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Literal

from sao.envs.sandbox import ToolResult

ToolFormat = Literal["tags", "hermes"]
TOOL_FORMATS: tuple[str, ...] = ("tags", "hermes")

TOOL_NAME = "python"
# OpenAI / Hermes function schema of the tool, for chat templates that list tools.
PYTHON_TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": ("Runs a Python 3 program in a sandbox (no network, limited time and "
                        "memory) and returns what it prints. State is not kept between calls."),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program"}},
            "required": ["code"],
        },
    },
}

_PY_RE = re.compile(r"<python>(.*?)</python>", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)
_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<eos>")
# Markup that must not appear verbatim in tool output: the tokenizer would turn
# it into control tokens.
_RESERVED = ("<python>", "</python>", "<output>", "</output>", "<answer>", "</answer>",
             "<eos>", "<bos>", "<pad>", "<tool_call>", "</tool_call>", "<tool_response>",
             "</tool_response>", "<|im_start|>", "<|im_end|>", "<|endoftext|>")


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    """One policy turn, parsed.

    Attributes:
      code: program of the tool call, or None.
      answer: final answer text, or None; stripped if one line, else only
        blank lines around it are removed (code keeps its indentation).
      error: why a tool call was malformed (bad JSON, unknown tool), or None.
    """

    code: str | None = None
    answer: str | None = None
    error: str | None = None


def check_format(fmt: str) -> str:
    if fmt not in TOOL_FORMATS:
        raise ValueError(f"unknown tool format {fmt!r}; expected one of {TOOL_FORMATS}")
    return fmt


def parse_turn(text: str, fmt: ToolFormat) -> ParsedTurn:
    """Parses a decoded policy turn in format ``fmt``; raises ValueError on an unknown format."""
    check_format(fmt)
    answers = _ANSWER_RE.findall(text)
    if answers:
        return ParsedTurn(answer=_strip_answer(answers[-1]))
    if fmt == "tags":
        blocks = _PY_RE.findall(text)
        return ParsedTurn(code=blocks[-1]) if blocks else ParsedTurn()
    calls = _TOOL_CALL_RE.findall(text)
    if not calls:
        body = _THINK_RE.sub("", text)
        for marker in _END_MARKERS:
            body = body.replace(marker, "")
        body = body.strip()
        return ParsedTurn(answer=body) if body else ParsedTurn()
    return _parse_hermes_call(calls[-1])


def _strip_answer(answer: str) -> str:
    """Strips a one-line answer; of a multi-line one (code) only the blank
    lines around it, so that indentation survives."""
    if "\n" not in answer.strip():
        return answer.strip()
    lines = answer.rstrip().split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines)


def _parse_hermes_call(raw: str) -> ParsedTurn:
    try:
        call = json.loads(raw.strip())
    except json.JSONDecodeError as e:
        return ParsedTurn(error=f"tool call is not valid JSON: {e}")
    if not isinstance(call, dict):
        return ParsedTurn(error="tool call must be a JSON object")
    if call.get("name") != TOOL_NAME:
        return ParsedTurn(error=f"unknown tool {call.get('name')!r}; the only tool is {TOOL_NAME!r}")
    args = call.get("arguments", {})
    if isinstance(args, str):            # some models emit arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            return ParsedTurn(error=f"tool arguments are not valid JSON: {e}")
    if not isinstance(args, dict) or not isinstance(args.get("code"), str):
        return ParsedTurn(error='tool arguments must be {"code": "<program>"}')
    return ParsedTurn(code=args["code"])


def sanitize(text: str) -> str:
    """Defuses reserved markup in tool output (``<answer>`` -> ``&lt;answer>``)."""
    for tag in _RESERVED:
        if tag in text:
            text = text.replace(tag, "&lt;" + tag[1:])
    return text


def render_tool_result(result: ToolResult, *, max_chars: int = 2000) -> str:
    """The observation text for a sandbox result: stdout, then stderr's tail,
    then a note on timeout / truncation / CPU budget / exit status; at most ``max_chars``
    characters (head of stdout and tail of stderr are kept)."""
    notes = []
    if result.timed_out:
        notes.append("[timed out]")
    if result.truncated:
        notes.append("[output truncated]")
    if result.cpu_exceeded:
        notes.append("[CPU time limit exceeded]")
    if result.exit_code not in (0, None):
        notes.append(f"[exit status {result.exit_code}]")
    note = " ".join(notes)
    budget = max(0, max_chars - len(note) - 2)   # two newlines
    out, err = sanitize(result.stdout), sanitize(result.stderr)
    if len(out) + len(err) > budget:
        err = err[-(budget // 2):] if err else ""
        out = out[: budget - len(err)]
    parts = [p for p in (out.rstrip("\n"), err.rstrip("\n"), note) if p]
    return "\n".join(parts)[-max_chars:] if max_chars > 0 else ""


def tool_instructions(fmt: ToolFormat) -> str:
    """How to call the tool and answer, for the prompt (format ``fmt``)."""
    check_format(fmt)
    if fmt == "tags":
        return ("You may run Python by writing <python>code</python>; you will see what it "
                "prints in <output></output>. Give the final answer as <answer>answer</answer>.")
    return ("You may call the python tool; each call runs a fresh program and returns what it "
            "prints. Give the final answer as <answer>answer</answer>.")


def hermes_system_prompt() -> str:
    """The system message listing the tool as Qwen3 / Hermes templates do."""
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{json.dumps(PYTHON_TOOL_SCHEMA)}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
