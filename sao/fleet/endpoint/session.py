"""One episode behind the endpoint: token-in/token-out across harness calls.

A harness sends the whole conversation on every call. The session keeps the
ids of everything it has rendered or sampled, and the messages they came
from. A call must repeat that history exactly (``Message.key``: role, text,
tool calls by name and arguments); only the messages after it are rendered
and encoded, then the engine continues the exact id sequence. So a sampled
turn is never re-tokenised, and what the learner trains on is what the
engine produced (docs/algorithm.md §2).

Rules (docs/rollout.md "Harness endpoint"):

* the same call again (a client retry) gets the same answer, counted;
* a call whose history differs from the recorded one (a rewrite, a dropped
  or edited message, other tools) ends the session: the trajectory is cut
  at the first difference, after the last action sampled from the history
  before it (an action that is itself the first differing message stays:
  it was sampled in a consistent context), and flagged
  (``metadata["cut"]``), and the harness gets a ``history_rewrite`` error;
* a call after the end gets ``session_ended``; a concurrent call in the same
  session ``session_busy``;
* an action cut by ``max_new_tokens`` ends the episode (``finish="length"``,
  reward 0, as in the native agent loop), so does a context that would not
  leave room for one more token (``context_length_exceeded``) and a call
  after ``max_turns`` actions (``max_turns_exceeded``); an action ending in
  a terminal token (EOS that is not the end-of-turn marker) ends it as
  ``"stop"``.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from sao.fleet.endpoint.messages import ChatRequest, Message, RequestError, ToolCall
from sao.rollout.agent import _Builder
from sao.rollout.base import Engine, SamplingParams
from sao.types import Trajectory


class Session:
    """The state of one episode's calls.

    Args:
      session_id: the id in the endpoint's URL.
      engine: samples each turn (``Engine.generate`` on the ids so far).
      tokenizer, dialect: encode rendered text, decode and parse actions.
      sampling: the run's sampling (temperature, ``max_new_tokens``); a
        harness's ``max_tokens`` can only lower ``max_new_tokens``.
      max_turns: most actions (>= 1); max_total_tokens: most ids (>= 2).
    """

    def __init__(self, session_id: str, engine: Engine, tokenizer, dialect,
                 sampling: SamplingParams, *, max_turns: int, max_total_tokens: int):
        if max_turns < 1 or max_total_tokens < 2:
            raise ValueError(f"max_turns >= 1 and max_total_tokens >= 2 needed, "
                             f"got {max_turns}, {max_total_tokens}")
        self.id, self.engine, self.tokenizer, self.dialect = session_id, engine, tokenizer, dialect
        self.sampling = sampling.replace(stop_token_ids=tuple(dict.fromkeys(
            sampling.stop_token_ids + dialect.stop_ids)))
        self.max_turns, self.max_total_tokens = max_turns, max_total_tokens
        self.traj = _Builder()
        self.tools_key: str | None = None
        self.seen: list[tuple[tuple, int]] = []   # (message key, token index where it starts)
        self.action_ends: list[int] = []          # token index after each action
        self.action_starts: list[int] = []        # token index of each action's first token
        self.ended = ""                          # why no more calls are served ("" = open)
        self.finish = "stop"
        self.cut: dict[str, Any] = {}
        self.counts = {"turns": 0, "num_tool_calls": 0, "retries": 0, "busy": 0, "after_end": 0,
                       "foreign_assistant": 0}
        self.timings = {"generate_s": 0.0, "endpoint_s": 0.0}
        self.last_call = time.monotonic()
        self._last: tuple[tuple, dict] | None = None
        self._lock = asyncio.Lock()

    # -- calls ---------------------------------------------------------------
    async def complete(self, request: ChatRequest) -> dict[str, Any]:
        """Answers one call with an OpenAI ``chat.completion`` object; raises
        ``RequestError`` as the module docstring says."""
        if self.ended:
            self.counts["after_end"] += 1
            raise RequestError(404, "session_ended",
                               f"session {self.id} has ended ({self.ended}); start a new episode")
        if self._lock.locked():
            self.counts["busy"] += 1
            raise RequestError(409, "session_busy",
                               f"session {self.id} is already answering a call")
        async with self._lock:
            self.last_call = time.monotonic()
            t0 = time.perf_counter()
            key = (request.tools_key(), tuple(m.key() for m in request.messages))
            if self._last is not None and self._last[0] == key:
                self.counts["retries"] += 1
                return self._last[1]
            if self.counts["turns"] >= self.max_turns:
                self._end("max_turns", "length")
                raise RequestError(400, "max_turns_exceeded",
                                   f"the episode allows {self.max_turns} model calls (it ended)")
            new = self._new_messages(request)
            start = len(self.traj.tokens)
            text = (self.dialect.prompt_text(new, request.tools) if not self.seen
                    else self.dialect.continuation_text(new, self.traj.tokens[-1]))
            ids = self.tokenizer.encode(text)
            if start + len(ids) >= self.max_total_tokens:
                self._end("max_total_tokens", "length")
                raise RequestError(400, "context_length_exceeded",
                                   f"This model's maximum context length is "
                                   f"{self.max_total_tokens} tokens; the conversation needs "
                                   f"{start + len(ids) + 1} (the episode ended)")
            self.tools_key = request.tools_key()
            self._record(new, start, ids)
            response = await self._sample(request, t0)
            self._last = (key, response)
            return response

    def _new_messages(self, request: ChatRequest) -> list[Message]:
        """The messages after the recorded history; cuts the episode on a rewrite."""
        msgs = request.messages
        if self.seen and request.tools_key() != self.tools_key:
            self._cut(0, "the tools differ from the first call's")
        for i, (key, _) in enumerate(self.seen):
            if i >= len(msgs):
                self._cut(i, f"the call has {len(msgs)} messages, {len(self.seen)} were recorded")
            if msgs[i].key() != key:
                self._cut(i, f"messages[{i}] ({msgs[i].role}) differs from the recorded one")
        return list(msgs[len(self.seen):])

    def _record(self, new: list[Message], start: int, ids: list[int]) -> None:
        for m in new:  # every new message starts where the rendered block starts
            if m.role == "assistant":
                self.counts["foreign_assistant"] += 1
            self.seen.append((m.key(), start))
        self.traj.add_context(ids, self.engine.version)

    async def _sample(self, request: ChatRequest, t0: float) -> dict[str, Any]:
        room = self.max_total_tokens - len(self.traj.tokens)
        budget = min(self.sampling.max_new_tokens, room, request.max_tokens or room)
        t_gen = time.perf_counter()
        self.timings["endpoint_s"] += t_gen - t0
        completion = await self.engine.generate(
            self.traj.tokens, self.sampling.replace(max_new_tokens=budget))
        t_done = time.perf_counter()
        self.timings["generate_s"] += t_done - t_gen
        start = len(self.traj.tokens)
        self.traj.add_action(completion)
        self.action_starts.append(start)
        self.action_ends.append(len(self.traj.tokens))
        self.counts["turns"] += 1
        toks = completion.tokens
        body = toks[:-1] if toks[-1] in self.dialect.strip_ids else toks
        content, calls = self.dialect.parse(self.tokenizer.decode(body), request.tools)
        turn = self.counts["turns"]
        tool_calls = tuple(ToolCall(f"call_{self.id[:12]}_{turn}_{i}", n, a)
                           for i, (n, a) in enumerate(calls))
        self.seen.append((Message("assistant", content, tool_calls).key(), start))
        self.counts["num_tool_calls"] += len(tool_calls)
        if completion.finish_reason == "length":
            self._end("truncated", "length")
        elif toks[-1] in self.dialect.terminal_ids:
            self._end("terminal_token", "stop")
        finish = "length" if completion.finish_reason == "length" else (
            "tool_calls" if tool_calls else "stop")
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if tool_calls:
            message["tool_calls"] = [c.to_openai() for c in tool_calls]
        self.timings["endpoint_s"] += time.perf_counter() - t_done
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": "sao-policy",
                "choices": [{"index": 0, "message": message, "finish_reason": finish,
                             "logprobs": None}],
                "usage": {"prompt_tokens": start, "completion_tokens": len(toks),
                          "total_tokens": start + len(toks)},
                "sao": {"policy_versions": [min(completion.versions), max(completion.versions)],
                        "text": self.tokenizer.decode(toks)}}   # what was sampled, verbatim

    # -- ends ----------------------------------------------------------------
    def _end(self, reason: str, finish: str) -> None:
        if not self.ended:
            self.ended, self.finish = reason, finish

    def _cut(self, index: int, why: str) -> None:
        # Every action sampled from the consistent context (messages < index) stays,
        # the one that *is* message ``index`` included: the harness diverged after it.
        start = self.seen[index][1] if index < len(self.seen) else len(self.traj.tokens)
        keep = max((e for b, e in zip(self.action_starts, self.action_ends) if b <= start),
                   default=0)
        lost = len(self.traj.tokens) - keep
        for name in ("tokens", "mask", "logprobs", "versions"):
            setattr(self.traj, name, getattr(self.traj, name)[:keep])
        self.action_starts = [b for b, e in zip(self.action_starts, self.action_ends) if e <= keep]
        self.action_ends = [e for e in self.action_ends if e <= keep]
        self.cut = {"cut": "history_rewrite", "cut_message": index, "cut_tokens_lost": lost,
                    "cut_reason": why}
        self._end("history_rewrite", "length")
        raise RequestError(400, "history_rewrite",
                           f"{why}: token-in/token-out forbids re-tokenising an earlier turn; "
                           f"the episode ended and its trajectory was cut at token {keep}")

    def done(self) -> None:
        """The harness finished the episode: it ends ``"stop"`` unless it had already ended."""
        self._end("finished", "stop")

    def abandon(self, reason: str) -> None:
        """Ends the session from outside (timeout, harness gone); later calls get ``session_ended``."""
        self._end(reason, "length")

    def trajectory(self, reward: float, *, prompt_id: str, finish: str | None = None,
                   metadata: dict[str, Any] | None = None) -> Trajectory:
        """The episode's trajectory. ``reward`` counts only for a session that
        ended cleanly (``finish="stop"``); truncated, cut or abandoned
        episodes score 0. ``finish`` overrides (``"error"``: the harness
        failed). Raises ValueError if no action was sampled."""
        self.done()
        if not self.action_ends:
            raise ValueError(f"session {self.id} ended ({self.ended}) before any action was sampled")
        n = self.action_ends[-1]   # end with the last action: later context has no action
        finish = finish or self.finish
        meta = {**(metadata or {}), **self.counts, **self.cut, "endpoint_end": self.ended}
        return Trajectory(tokens=self.traj.tokens[:n], action_mask=self.traj.mask[:n],
                          rollout_logprobs=self.traj.logprobs[:n],
                          policy_version=self.traj.versions[:n],
                          reward=float(reward) if finish == "stop" else 0.0, finish=finish,
                          prompt_id=prompt_id, trajectory_id=self.id, metadata=meta,
                          timings=dict(self.timings))
