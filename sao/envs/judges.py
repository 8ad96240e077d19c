"""Judges for the online drift environment: answer quality and answer style.

A judge returns a ``Verdict`` of two binary scores (docs/algorithm.md §8: reward =
quality x style, both binary). ``RuleJudge`` checks correctness with the
task's grader and the style with a regular expression; ``OpenAIJudge`` asks a
model behind an OpenAI-compatible ``/chat/completions`` endpoint (aiohttp,
with timeouts and retries) to grade both and answer in JSON.
"""
from __future__ import annotations

import abc
import asyncio
import dataclasses
import json
import re
from typing import Any, Mapping

from sao.envs.base import Task

_NUM = r"-?\d+(?:\.\d+)?"
# Answer styles: name -> (description for prompts / judges, full-match regex).
STYLES: dict[str, tuple[str, re.Pattern[str]]] = {
    "bare": ("only the number, e.g. 42", re.compile(rf"{_NUM}")),
    "sentence": ("the sentence 'The answer is N.', e.g. The answer is 42.",
                 re.compile(rf"The answer is {_NUM}\.")),
    "boxed": ("the number in \\boxed{}, e.g. \\boxed{42}", re.compile(rf"\\boxed\{{{_NUM}\}}")),
}
_NUMBER_RE = re.compile(_NUM)


class JudgeError(RuntimeError):
    """The judge could not give a verdict (endpoint down, bad reply)."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """quality, style: 0.0 or 1.0; detail: the judge's raw reply or rule notes."""

    quality: float
    style: float
    detail: str = ""


def check_style(style: str) -> str:
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; expected one of {sorted(STYLES)}")
    return style


def extract_number(answer: str) -> str | None:
    """The first number in ``answer`` (e.g. ``"The answer is -3."`` -> ``"-3"``)."""
    match = _NUMBER_RE.search(answer)
    return match.group(0) if match else None


class Judge(abc.ABC):
    """Grades one final answer for quality and for the required style."""

    @abc.abstractmethod
    def judge(self, question: str, answer: str, entry: Mapping[str, Any],
              style: str) -> Verdict:
        """Raises JudgeError if no verdict can be given, ValueError on an unknown style."""


class RuleJudge(Judge):
    """Quality: the task grades the first number of the answer (1 if the score
    is 1); style: the answer (stripped) fully matches the style's regex."""

    def __init__(self, task: Task):
        self.task = task

    def judge(self, question, answer, entry, style):
        del question
        pattern = STYLES[check_style(style)][1]
        number = extract_number(answer)
        quality = 1.0 if number is not None and self.task.grade(number, entry) >= 1.0 else 0.0
        style_ok = 1.0 if pattern.fullmatch(answer.strip()) else 0.0
        return Verdict(quality, style_ok, f"number={number}")


_JUDGE_SYSTEM = (
    "You grade answers. Reply with JSON only: {\"quality\": 0 or 1, \"style\": 0 or 1}. "
    "quality is 1 if the answer is correct; style is 1 if the answer is written exactly "
    "in the required style.")


class OpenAIJudge(Judge):
    """A judge model behind an OpenAI-compatible chat-completions endpoint.

    Args:
      base_url: e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is appended).
      model: model name sent in the request.
      api_key: sent as ``Authorization: Bearer``; None sends none.
      timeout_s: total seconds per HTTP attempt.
      max_retries: extra attempts after a failed one (connection error,
        timeout, HTTP status >= 500, unparsable reply).
      temperature: sampling temperature of the judge (0 = greedy).
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 timeout_s: float = 30.0, max_retries: int = 2, temperature: float = 0.0):
        if timeout_s <= 0 or max_retries < 0:
            raise ValueError("timeout_s must be > 0 and max_retries >= 0")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key = model, api_key
        self.timeout_s, self.max_retries, self.temperature = timeout_s, max_retries, temperature

    def request_body(self, question: str, answer: str, entry: Mapping[str, Any],
                     style: str) -> dict[str, Any]:
        """The chat-completions request for one answer."""
        reference = entry.get("answer", "") if isinstance(entry, Mapping) else ""
        user = (f"Question:\n{question}\n\nReference answer: {reference}\n\n"
                f"Required style: {STYLES[check_style(style)][0]}\n\nAnswer to grade:\n{answer}")
        return {"model": self.model, "temperature": self.temperature, "max_tokens": 64,
                "messages": [{"role": "system", "content": _JUDGE_SYSTEM},
                             {"role": "user", "content": user}]}

    async def ajudge(self, question, answer, entry, style) -> Verdict:
        import aiohttp
        body = self.request_body(question, answer, entry, style)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        last_error = "no attempt"
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for attempt in range(self.max_retries + 1):
                if attempt:
                    await asyncio.sleep(min(0.2 * 2 ** attempt, 2.0))
                try:
                    async with session.post(self.url, json=body, headers=headers) as resp:
                        text = await resp.text()
                        if resp.status >= 500:
                            last_error = f"HTTP {resp.status}: {text[:200]}"
                            continue
                        if resp.status != 200:   # client errors do not improve on retry
                            raise JudgeError(f"judge endpoint answered HTTP {resp.status}: "
                                             f"{text[:200]}")
                    return parse_verdict(text)
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    last_error = f"{type(e).__name__}: {e}"
                except ValueError as e:
                    last_error = str(e)
        raise JudgeError(f"judge at {self.url} failed after {self.max_retries + 1} "
                         f"attempts: {last_error}")

    def judge(self, question, answer, entry, style) -> Verdict:
        """Blocking ``ajudge`` (call from a worker thread, not from an event loop)."""
        return asyncio.run(self.ajudge(question, answer, entry, style))


def parse_verdict(response_text: str) -> Verdict:
    """Reads a chat-completions response whose message holds
    ``{"quality": 0|1, "style": 0|1}``; raises ValueError if it does not."""
    try:
        content = json.loads(response_text)["choices"][0]["message"]["content"]
        match = re.search(r"\{.*?\}", content, re.DOTALL)
        scores = json.loads(match.group(0)) if match else None
        quality, style = float(scores["quality"]), float(scores["style"])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"unparsable judge reply: {response_text[:200]!r} ({e})") from e
    if quality not in (0.0, 1.0) or style not in (0.0, 1.0):
        raise ValueError(f"judge scores must be 0 or 1, got {quality}, {style}")
    return Verdict(quality, style, content)


def judge_from_spec(spec: str, *, model: str = "judge", api_key: str | None = None,
                    timeout_s: float = 30.0) -> Judge | None:
    """A judge from a config string: ``"rule"`` -> None (the drift env then
    uses a ``RuleJudge`` per task); an ``http(s)://.../v1`` URL -> an
    ``OpenAIJudge`` for ``model``. Raises ValueError on anything else."""
    if spec == "rule":
        return None
    if spec.startswith(("http://", "https://")):
        return OpenAIJudge(spec, model, api_key=api_key, timeout_s=timeout_s)
    raise ValueError(f"judge must be 'rule' or an http(s) endpoint URL, got {spec!r}")
