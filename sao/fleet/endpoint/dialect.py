"""How a model writes tool calls and reads tool results: text both ways.

A dialect renders chat messages (and the harness's ``tools``) as the model's
chat template does, and parses a sampled turn into ``content`` and
``tool_calls``. The session (sao/fleet/endpoint/session.py) encodes what a
dialect renders only for messages it has not seen: earlier turns keep their
ids.

* ``HermesChatML`` (Qwen3, SmolLM2, any ChatML model): the tool list in the
  system turn, ``<tool_call>{"name", "arguments"}</tool_call>`` blocks in
  assistant turns, tool results as ``<tool_response>`` blocks of one user
  turn, exactly as Qwen3's chat template renders them (and as
  ``sao.rollout.agent.chatml_tool_format`` frames observations, so an
  endpoint episode and a native one give the same ids).
* ``ByteTags`` (the tiny byte-level models): ``<python>arg</python>`` calls
  the first tool with its first parameter, ``<output>...</output>`` frames a
  result, ``<answer>...</answer>`` / ``<eos>`` ends a turn without a call
  (``sao.rollout.agent.byte_tool_format``).
"""
from __future__ import annotations

import json
import re
from typing import Sequence

from sao.envs import tools as tool_text
from sao.fleet.endpoint.messages import Message, ToolSpec
from sao.models.chat import ChatTemplate, template_from_jinja

ParsedCall = tuple[str, str]       # (function name, arguments as a JSON string)
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def hermes_tools_block(tools: Sequence[ToolSpec]) -> str:
    """Qwen3's ``# Tools`` system section for ``tools`` (one JSON schema a line);
    for the single Python tool it equals ``sao.envs.tools.hermes_system_prompt()``."""
    schemas = "\n".join(json.dumps(t.schema) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{schemas}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


class HermesChatML:
    """ChatML turns with Hermes tool calls (Qwen3's template)."""

    name = "hermes"

    def __init__(self, tokenizer, template: ChatTemplate | None = None):
        self.template = template or template_from_jinja(getattr(tokenizer, "chat_template", None))
        ids = tokenizer.special_ids
        self.end_id = ids.get(self.template.end)
        self.stop_ids = tuple(dict.fromkeys(
            ([self.end_id] if self.end_id is not None else []) + list(tokenizer.stop_ids)))
        self.terminal_ids = tuple(i for i in tokenizer.stop_ids if i != self.end_id)
        self.strip_ids = self.stop_ids     # end markers are not part of the message text
        self.end_text = self.template.end

    def _turn(self, role: str, text: str) -> str:
        return f"{self.template.start}{role}\n{text}{self.template.end}\n"

    def _assistant(self, m: Message) -> str:
        text = m.content
        for i, call in enumerate(m.tool_calls):
            if i or m.content:
                text += "\n"
            text += f'<tool_call>\n{{"name": "{call.name}", "arguments": {call.arguments}}}\n</tool_call>'
        return self._turn("assistant", text)

    def action_text(self, m: Message) -> str:
        """The text a model writes for the assistant message ``m`` (end marker included)."""
        inner = self._assistant(m)
        return inner[len(f"{self.template.start}assistant\n"):-1]

    def _messages(self, messages: Sequence[Message]) -> str:
        out = []
        for i, m in enumerate(messages):
            if m.role == "tool":
                if i == 0 or messages[i - 1].role != "tool":
                    out.append(f"{self.template.start}user")
                out.append(f"\n<tool_response>\n{m.content}\n</tool_response>")
                if i + 1 == len(messages) or messages[i + 1].role != "tool":
                    out.append(f"{self.template.end}\n")
            elif m.role == "assistant":
                out.append(self._assistant(m))
            else:
                out.append(self._turn(m.role, m.content))
        return "".join(out)

    def prompt_text(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
        """The first request: system (with the tool list), the rest, the generation prompt."""
        messages = list(messages)
        head = ""
        if tools:
            system = messages.pop(0).content if messages and messages[0].role == "system" else ""
            head = self._turn("system", (system + "\n\n" if system else "")
                              + hermes_tools_block(tools))
        elif self.template.default_system is not None and messages[0].role != "system":
            head = self._turn("system", self.template.default_system)
        return head + self._messages(messages) + self.template.generation_prompt_text()

    def continuation_text(self, messages: Sequence[Message], last_token: int) -> str:
        """New messages after a sampled assistant turn, then the generation prompt.
        The turn's own end marker was sampled; a turn cut without one is closed here."""
        close = "\n" if last_token == self.end_id else self.end_text + "\n"
        return close + self._messages(messages) + self.template.generation_prompt_text()

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> tuple[str, list[ParsedCall]]:
        """``(content, calls)`` of a decoded turn (end marker removed). A block
        that is not a JSON object with a string ``name`` stays in the content."""
        del tools
        calls, kept, last = [], [], 0
        for m in _TOOL_CALL_RE.finditer(text):
            call = _hermes_call(m.group(1))
            if call is None:
                continue
            kept.append(text[last:m.start()])
            last = m.end()
            calls.append(call)
        kept.append(text[last:])
        return "".join(kept).strip(), calls


def _hermes_call(raw: str) -> ParsedCall | None:
    try:
        call = json.loads(raw.strip())
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return None
    args = call.get("arguments", {})
    if isinstance(args, str):
        try:
            json.loads(args)
        except ValueError:
            return None
        return call["name"], args
    return call["name"], json.dumps(args)


class ByteTags:
    """The byte-level models' tags (no chat markers, no tool list in the prompt)."""

    name = "tags"

    def __init__(self, tokenizer):
        ids = tokenizer.special_ids
        self.stop_ids = (ids["</python>"], ids["</answer>"], tokenizer.eos_id)
        self.terminal_ids = (tokenizer.eos_id,)
        self.strip_ids = (tokenizer.eos_id,)   # </python>, </answer> close the tags parsed

    @staticmethod
    def _messages(messages: Sequence[Message]) -> str:
        out = []
        for m in messages:
            if m.role == "tool":
                out.append(f"<output>{m.content}</output>")
            elif m.role == "assistant":
                out.append(m.content + "".join(
                    f"<python>{_first_value(c.arguments)}</python>" for c in m.tool_calls))
            else:
                out.append(m.content + "\n")
        return "".join(out)

    def prompt_text(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
        del tools
        return self._messages(messages)

    def action_text(self, m: Message) -> str:
        """The text a model writes for the assistant message ``m``."""
        if m.tool_calls:
            return self._messages([m])
        return f"<answer>{m.content}</answer>"

    def continuation_text(self, messages: Sequence[Message], last_token: int) -> str:
        del last_token
        return self._messages(messages)

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> tuple[str, list[ParsedCall]]:
        """``<python>x</python>`` calls ``tools[0]`` with ``{its first parameter: x}``;
        ``<answer>x</answer>`` is the content ``x``."""
        parsed = tool_text.parse_turn(text, "tags")
        if parsed.code is not None and tools:
            params = tools[0].required_params() or ["input"]
            return "", [(tools[0].name, json.dumps({params[0]: parsed.code}))]
        content = parsed.answer if parsed.answer is not None else text
        return content.strip(), []


def _first_value(arguments: str) -> str:
    try:
        args = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(args, dict) and args:
        value = next(iter(args.values()))
        return value if isinstance(value, str) else json.dumps(value)
    return arguments


def dialect_for(tokenizer):
    """``ByteTags`` for the byte-level tokenizer, ``HermesChatML`` for a ChatML one.
    Raises ValueError for a tokenizer with neither (its chat template is not ChatML)."""
    ids = tokenizer.special_ids
    if "<python>" in ids and "<|im_start|>" not in ids:
        return ByteTags(tokenizer)
    return HermesChatML(tokenizer)
