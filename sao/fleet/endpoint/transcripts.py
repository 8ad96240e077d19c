"""Recorded harness calls, and their replay through a session (``harness_check``).

A transcript is a JSON-lines file, one call a line: ``{"request": body,
"response": body}`` (``response`` absent or an error object when the call was
refused). ``Recorder`` writes one file per session when the endpoint has a
``record_dir``; any OpenAI-compatible proxy log in that shape works too.

``replay`` feeds a transcript's requests through a fresh ``Session`` whose
engine "samples" exactly what the model sampled then (our endpoint records
it in ``response["sao"]["text"]``; for other logs, the assistant turn the
harness sent back next, rendered in the dialect), so the check needs no
model: it shows whether the harness repeats its history verbatim (prefix
stability), where it would have been cut, and how many tokens a re-rendering
endpoint would have changed (``retemplated_tokens``: ids of the whole final
conversation rendered from scratch that differ from the session's
token-in/token-out ids, counted from the first difference).

What a cut costs is two counts: ``cut_tokens_lost``, the ids the session had
recorded that the cut removes (the trajectory's own metadata; 0 when the
rewritten message is the latest action, which stays), and
``tokens_after_cut``, the ids the refused call and every later call of the
transcript would have added (their new messages, rendered as the session
renders a continuation, and the model's replies), which no trajectory gets.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from typing import Any, Iterable

from sao.fleet.endpoint.messages import Message, RequestError, parse_request
from sao.fleet.endpoint.session import Session
from sao.rollout.base import Completion, Engine, EngineError, SamplingParams


class Recorder:
    """Appends each call of a session to ``<directory>/<session>.jsonl``."""

    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)

    def record(self, session_id: str, request: Any, response: Any) -> None:
        path = os.path.join(self.directory, f"{session_id}.jsonl")
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"request": request, "response": response}) + "\n")


def load(path: str) -> list[dict]:
    """The calls of one transcript file; raises ValueError on a line that is not a call."""
    calls = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                call = json.loads(line)
                if not isinstance(call, dict) or not isinstance(call.get("request"), dict):
                    raise ValueError(f"{path}:{n}: expected {{'request': ..., 'response': ...}}")
                calls.append(call)
    return calls


def transcript_files(paths: Iterable[str]) -> list[str]:
    """``*.jsonl`` files of the given files and directories, sorted."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            out += [os.path.join(p, f) for f in sorted(os.listdir(p)) if f.endswith(".jsonl")]
        else:
            out.append(p)
    return out


def _assistant_after(calls: list[dict], i: int) -> dict | None:
    """What the model said in answer to call ``i``: the next call's echo of it,
    else the recorded response."""
    n = len(calls[i]["request"].get("messages") or [])
    if i + 1 < len(calls):
        later = calls[i + 1]["request"].get("messages") or []
        if len(later) > n and isinstance(later[n], dict) and later[n].get("role") == "assistant":
            return later[n]
    resp = calls[i].get("response")
    if isinstance(resp, dict) and resp.get("choices"):
        return resp["choices"][0].get("message")
    return None


class ReplayEngine(Engine):
    """Returns the ids of the next scripted text, whatever the prompt."""

    def __init__(self, tokenizer, texts: list[str]):
        self.tokenizer, self.texts, self.prompts = tokenizer, list(texts), []

    @property
    def version(self) -> int:
        return 0

    async def generate(self, prompt_tokens, params: SamplingParams) -> Completion:
        self.prompts.append(list(prompt_tokens))
        ids = self.tokenizer.encode(self.texts.pop(0)) if self.texts else [0]
        ids = ids[:params.max_new_tokens] or [0]
        finish = "stop" if ids[-1] in params.stop_token_ids else "length"
        return Completion(ids, [-1.0] * len(ids), [0] * len(ids), finish)

    async def load_weights(self, version, uri):
        raise EngineError("a transcript replay answers with recorded text: it loads no weights")

    async def health(self) -> bool:
        return True


@dataclasses.dataclass
class ReplayReport:
    """One transcript's replay (see the module docstring)."""

    path: str
    calls: int = 0
    stable_calls: int = 0
    cut: dict[str, Any] = dataclasses.field(default_factory=dict)
    errors: dict[str, int] = dataclasses.field(default_factory=dict)
    tito_tokens: int = 0
    retemplated_tokens: int = 0

    @property
    def tokens_lost(self) -> int:
        """Ids a cut costs: recorded ones it removed plus the later calls' (0 without a cut)."""
        return self.cut.get("cut_tokens_lost", 0) + self.cut.get("tokens_after_cut", 0)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


async def replay(path: str, tokenizer, dialect, *, max_total_tokens: int = 1 << 20) -> ReplayReport:
    """Replays one transcript file; never raises on a bad call (it is counted)."""
    calls, report = load(path), ReplayReport(path)
    texts, answered = [], []
    for i in range(len(calls)):
        sampled = (calls[i].get("response") or {}).get("sao", {}).get("text")
        answered.append(isinstance(sampled, str))
        if isinstance(sampled, str):   # recorded by our endpoint: the model's own text
            texts.append(sampled)
            continue
        msg = _assistant_after(calls, i)
        answered[-1] = msg is not None
        try:
            m = parse_request({"messages": [msg]}).messages[0] if msg else Message("assistant", "")
        except RequestError:
            m = Message("assistant", "")
        texts.append(dialect.action_text(m))
    engine = ReplayEngine(tokenizer, texts)
    session = Session("replay", engine, tokenizer, dialect, SamplingParams(max_new_tokens=1 << 16),
                      max_turns=1 << 30, max_total_tokens=max_total_tokens)
    last_request, cut_call = None, len(calls)
    for i, call in enumerate(calls):
        report.calls += 1
        try:
            request = parse_request(call["request"])
            await session.complete(request)
            last_request = request
            report.stable_calls += 1
        except RequestError as e:
            report.errors[e.code] = report.errors.get(e.code, 0) + 1
            if session.ended:
                cut_call = i
                break
    report.cut = dict(session.cut)
    if session.cut:
        report.cut.update(cut_call=cut_call, tokens_after_cut=_tokens_after(
            calls, cut_call, texts, answered, tokenizer, dialect))
    report.tito_tokens = len(session.traj.tokens)
    if last_request is not None and session.action_ends and not session.cut:
        # The context of the last call as an endpoint re-rendering the whole
        # conversation would have encoded it, against the ids this session kept.
        tito = list(session.traj.tokens[:session.seen[-1][1]])   # up to the last action
        fresh = tokenizer.encode(dialect.prompt_text(list(last_request.messages), last_request.tools))
        report.retemplated_tokens = len(tito) - _common_prefix(tito, fresh)
    return report


def _tokens_after(calls: list[dict], first: int, texts: list[str], answered: list[bool],
                  tokenizer, dialect) -> int:
    """Ids that calls ``first`` ... of a transcript add, each as the session would
    have recorded it after the call before: the messages past that call's history
    and its reply, rendered as a continuation; then the call's own reply. A call
    that does not parse adds nothing."""
    total, prev_len, prev_last = 0, None, -1
    for j in range(max(first - 1, 0), len(calls)):
        try:
            request = parse_request(calls[j]["request"])
        except RequestError:
            continue
        reply = tokenizer.encode(texts[j]) if answered[j] else []
        if j >= first:
            new = list(request.messages[prev_len:]) if prev_len is not None else []
            total += (len(tokenizer.encode(dialect.continuation_text(new, prev_last)))
                      + len(reply))
        prev_len = len(request.messages) + (1 if reply else 0)
        prev_last = reply[-1] if reply else -1
    return total


def replay_all(paths: Iterable[str], tokenizer, dialect) -> list[ReplayReport]:
    return [asyncio.run(replay(p, tokenizer, dialect)) for p in transcript_files(paths)]
