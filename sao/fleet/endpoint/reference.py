"""A small reference harness of ours: an OpenAI chat client driving an ``Env``.

It does what any tool-calling harness does (send the conversation and
``tools``, read ``tool_calls``, send tool results back as ``tool`` messages)
and steps a SAO environment (sao/envs/base.py) with each turn, so that tests
and benchmarks exercise the endpoint the way an external harness would. With
the same environment and engine it yields the same trajectory as the native
agent loop (sao/rollout/agent.py), token for token: tested in
tests/fleet/test_endpoint_reference.py.

``ChatClient`` is the HTTP part (aiohttp); it raises ``EndpointError`` with
the endpoint's status and error code.
"""
from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any, Callable, Mapping, Sequence

import aiohttp

from sao.fleet.endpoint.episode import HarnessResult


class EndpointError(RuntimeError):
    """The endpoint refused a call: ``status`` (HTTP) and ``code`` (its error code)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code = status, code


class ChatClient:
    """Minimal OpenAI chat-completions client (one ``aiohttp`` session per client)."""

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 600.0,
                 http: aiohttp.ClientSession | None = None):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.http = http   # a shared connection pool, or None: one per call

    async def post_raw(self, data: bytes) -> tuple[int, dict]:
        if self.http is not None:
            return await self._post(self.http, data)
        async with aiohttp.ClientSession(timeout=self.timeout) as http:
            return await self._post(http, data)

    async def _post(self, http: aiohttp.ClientSession, data: bytes) -> tuple[int, dict]:
        async with http.post(self.url, data=data, headers=self.headers, timeout=self.timeout) as r:
            return r.status, await r.json(content_type=None)

    async def complete(self, messages: Sequence[Mapping], tools: Sequence[Mapping] = (),
                       **extra) -> dict:
        """The assistant message of one call; raises ``EndpointError``."""
        body = {"model": "sao-policy", "messages": list(messages), **extra}
        if tools:
            body["tools"] = list(tools)
        status, out = await self.post_raw(json.dumps(body).encode())
        if status != 200:
            err = out.get("error", {}) if isinstance(out, dict) else {}
            raise EndpointError(status, err.get("code", ""), err.get("message", str(out)))
        return out["choices"][0]["message"]


def action_text(message: Mapping[str, Any], fmt: str = "hermes") -> str:
    """An assistant message as text for envs that parse text: Hermes
    ``<tool_call>`` blocks, or for ``fmt="tags"`` ``<python>first argument</python>``
    per call and ``<answer>content</answer>`` without one."""
    text = message.get("content") or ""
    calls = message.get("tool_calls") or []
    if fmt == "tags":
        if not calls:
            return f"<answer>{text}</answer>"
        for call in calls:
            args = json.loads(call["function"]["arguments"] or "{}")
            value = next(iter(args.values()), "") if isinstance(args, dict) and args else ""
            text += f"<python>{value}</python>"
        return text
    for call in calls:
        fn = call["function"]
        text += f'\n<tool_call>\n{{"name": "{fn["name"]}", "arguments": {fn["arguments"]}}}\n</tool_call>'
    return text


class ReferenceHarness:
    """Drives ``make_env()`` through the endpoint.

    Args:
      make_env: a fresh ``Env`` per episode (``reset`` starts it; its return
        value is not sent: the endpoint renders the messages itself).
      messages_for: ``prompt -> [messages]`` the conversation starts with.
      tools: OpenAI ``tools`` sent on every call.
      fmt: how the env reads a turn (``action_text``): ``"hermes"`` or ``"tags"``.
      max_calls: most model calls before giving up (truncated, reward 0).
    """

    def __init__(self, make_env: Callable[[], Any],
                 messages_for: Callable[[Mapping[str, Any]], list[dict]],
                 tools: Sequence[Mapping] = (), *, fmt: str = "hermes", max_calls: int = 64):
        self.make_env, self.messages_for = make_env, messages_for
        self.tools, self.fmt, self.max_calls = list(tools), fmt, max_calls

    async def run(self, prompt: Mapping[str, Any], base_url: str, api_key: str) -> HarnessResult:
        async with aiohttp.ClientSession() as http:
            return await self._run(prompt, ChatClient(base_url, api_key, http=http))

    async def _run(self, prompt: Mapping[str, Any], client: ChatClient) -> HarnessResult:
        env = self.make_env()
        await asyncio.to_thread(env.reset, prompt)
        step = getattr(env, "astep", None)
        messages = self.messages_for(prompt)
        for _ in range(self.max_calls):
            reply = await client.complete(messages, self.tools)
            text = action_text(reply, self.fmt)
            result = await step(text) if step and inspect.iscoroutinefunction(step) \
                else await asyncio.to_thread(env.step, text)
            if result.done:
                return HarnessResult(float(result.reward), dict(result.info or {}))
            messages.append(reply)
            calls = reply.get("tool_calls") or []
            if calls:
                messages.append({"role": "tool", "tool_call_id": calls[0]["id"],
                                 "content": result.observation_text or ""})
            else:
                messages.append({"role": "user", "content": result.observation_text or ""})
        return HarnessResult(0.0, {"harness_end": "max_calls"}, truncated=True)
