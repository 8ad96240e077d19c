"""OpenAI chat-completions requests from a harness: checked, then normalised.

Everything a harness sends is untrusted. ``parse_request`` turns a decoded
JSON body into a ``ChatRequest`` of frozen ``Message`` / ``ToolSpec`` values
or raises ``RequestError`` (HTTP status, stable error code, message) that the
server returns as an OpenAI error object. ``Message.key`` is what the session
compares to decide whether a harness sent back exactly the history it was
given (token-in/token-out, docs/rollout.md "Harness endpoint"): role, text
and tool calls by name and parsed arguments, nothing a client library may add
(``function_call: null``, ``provider_specific_fields``, ...).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
MAX_MESSAGES = 20_000
MAX_TOOLS = 128


class RequestError(Exception):
    """A request the endpoint refuses.

    Attributes:
      status: HTTP status (400 bad input, 401 token, 404 unknown / ended
        session, 409 concurrent call, 413 body too large).
      code: stable snake_case reason, also a metric key.
      message: what went wrong, for the harness's log.
    """

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = int(status), code, message

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "code": self.code}}


def _bad(message: str, code: str = "invalid_request") -> RequestError:
    return RequestError(400, code, message)


def canonical_arguments(arguments: str) -> str:
    """Arguments as compared across turns: sorted compact JSON if ``arguments``
    parses as JSON, else the raw string."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return arguments


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One function call of an assistant message (``arguments``: a JSON string)."""

    id: str
    name: str
    arguments: str

    def key(self) -> tuple[str, str]:
        return (self.name, canonical_arguments(self.arguments))

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclasses.dataclass(frozen=True)
class Message:
    """One chat message; ``content`` is text ("" for none)."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""

    def key(self) -> tuple:
        return (self.role, self.content, tuple(c.key() for c in self.tool_calls))


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """One ``{"type": "function", "function": {...}}`` entry of ``tools`` (kept as given)."""

    name: str
    schema: dict[str, Any]

    def required_params(self) -> list[str]:
        params = self.schema.get("function", {}).get("parameters") or {}
        req = params.get("required") or list((params.get("properties") or {}).keys())
        return [p for p in req if isinstance(p, str)]


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A checked request: messages, tools, the harness's token cap (None: the run's)."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    max_tokens: int | None

    def tools_key(self) -> str:
        return json.dumps([t.schema for t in self.tools], sort_keys=True)


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):   # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise _bad(f"{where}: only text content parts are supported", "unsupported_content")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"{where}: content must be a string, a list of text parts or null")


def _tool_call(raw: Any, where: str) -> ToolCall:
    if not isinstance(raw, dict) or not isinstance(raw.get("function"), dict):
        raise _bad(f"{where}: a tool call is {{'id', 'type': 'function', 'function': {{...}}}}")
    fn = raw["function"]
    name, args = fn.get("name"), fn.get("arguments", "{}")
    if not isinstance(name, str) or not name:
        raise _bad(f"{where}: tool call without a function name")
    if isinstance(args, dict):
        args = json.dumps(args)
    if not isinstance(args, str):
        raise _bad(f"{where}: tool call arguments must be a JSON string")
    call_id = raw.get("id") or ""
    if not isinstance(call_id, str):
        raise _bad(f"{where}: tool call id must be a string")
    return ToolCall(call_id, name, args)


def _message(raw: Any, i: int) -> Message:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise _bad(f"{where} must be an object")
    role = raw.get("role")
    if role not in ROLES:
        raise _bad(f"{where}: unknown role {role!r}; expected one of {ROLES}", "unknown_role")
    content = _text(raw.get("content"), where)
    calls = raw.get("tool_calls") or []
    if role != "assistant" and calls:
        raise _bad(f"{where}: only assistant messages carry tool_calls")
    if not isinstance(calls, list):
        raise _bad(f"{where}: tool_calls must be a list")
    call_id = raw.get("tool_call_id") or ""
    if role == "tool" and (not isinstance(call_id, str) or not call_id):
        raise _bad(f"{where}: a tool message needs its tool_call_id")
    return Message(role, content, tuple(_tool_call(c, where) for c in calls),
                   call_id if role == "tool" else "")


def _tools(raw: Any) -> tuple[ToolSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise _bad(f"tools must be a list of at most {MAX_TOOLS} functions")
    specs, names = [], set()
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" \
                or not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}")
        if fn["name"] in names:
            raise _bad(f"tools[{i}]: duplicate function name {fn['name']!r}")
        names.add(fn["name"])
        specs.append(ToolSpec(fn["name"], t))
    return tuple(specs)


def _check_tool_references(messages: tuple[Message, ...], tools: tuple[ToolSpec, ...],
                           tool_choice: Any) -> None:
    names = {t.name for t in tools}
    issued: set[str] = set()
    for i, m in enumerate(messages):
        issued.update(c.id for c in m.tool_calls if c.id)
        if m.role == "tool" and m.tool_call_id not in issued:
            raise _bad(f"messages[{i}]: tool_call_id {m.tool_call_id!r} answers no earlier "
                       "tool call", "unknown_tool_call")
    if tool_choice is None or tool_choice in ("auto", "none", "required"):
        return
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise _bad("tool_choice must be 'auto', 'none', 'required' or a named function")
    if name not in names:
        raise _bad(f"tool_choice names the unknown tool {name!r}; tools: {sorted(names)}",
                   "unknown_tool")


def parse_request(body: Any) -> ChatRequest:
    """Checks a decoded ``/v1/chat/completions`` body.

    Accepted: ``messages`` (1..MAX_MESSAGES), ``tools``, ``tool_choice``,
    ``max_tokens`` / ``max_completion_tokens`` (>= 1), ``n`` = 1, ``stream``
    false; other fields (``model``, ``temperature``, ...) are ignored: the run
    decides the model and the sampling. Raises ``RequestError`` (400) naming
    the first problem: ``invalid_request``, ``unknown_role``, ``unknown_tool``,
    ``unknown_tool_call``, ``unsupported_content``, ``streaming_unsupported``.
    """
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    if body.get("stream"):
        raise _bad("streaming is not supported: send stream=false", "streaming_unsupported")
    if body.get("n", 1) != 1:
        raise _bad("n must be 1 (one sample per turn)")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw or len(raw) > MAX_MESSAGES:
        raise _bad(f"messages must be a non-empty list of at most {MAX_MESSAGES}")
    messages = tuple(_message(m, i) for i, m in enumerate(raw))
    tools = _tools(body.get("tools"))
    _check_tool_references(messages, tools, body.get("tool_choice"))
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise _bad(f"max_tokens must be a positive integer, got {cap!r}")
    return ChatRequest(messages, tools, cap)
