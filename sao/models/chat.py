"""ChatML chat-template rendering to token ids.

ChatML (used by Qwen3 and SmolLM2) renders each message as
``<|im_start|>{role}\\n{content}<|im_end|>\\n`` and the assistant generation
prompt as ``<|im_start|>assistant\\n``. Rendering goes straight to token ids so
that the agent loop can append turns token-in/token-out: because every
message starts and ends at a special token, the ids of a conversation are
exactly the concatenation of the ids of its messages (tested), so an
observation turn can be appended without re-tokenising the history.

With the byte-level tokenizer the ChatML markers are not single tokens; they
are encoded as their bytes (still exact and reversible).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Sequence

from sao.models.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant", "tool")

_DEFAULT_SYSTEM_RE = re.compile(
    r"<\|im_start\|>system\n(.*?)<\|im_end\|>", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """A ChatML template.

    Attributes:
      start, end: the turn markers (``<|im_start|>``, ``<|im_end|>``).
      default_system: system message inserted when a conversation does not
        start with one (SmolLM2 does this); None inserts nothing.
    """

    start: str = "<|im_start|>"
    end: str = "<|im_end|>"
    default_system: str | None = None

    def message_text(self, role: str, content: str) -> str:
        """The text of one message; raises ValueError on an unknown role."""
        if role not in ROLES:
            raise ValueError(f"unknown chat role {role!r}; expected one of {ROLES}")
        if not isinstance(content, str):
            raise TypeError(f"message content must be str, got {type(content).__name__}")
        return f"{self.start}{role}\n{content}{self.end}\n"

    def generation_prompt_text(self) -> str:
        return f"{self.start}assistant\n"

    def render_text(self, messages: Sequence[Mapping[str, str]],
                    add_generation_prompt: bool = True) -> str:
        """The whole conversation as text (what HF ``apply_chat_template`` gives)."""
        parts = [self.message_text(m["role"], m["content"])
                 for m in self._with_default_system(messages)]
        if add_generation_prompt:
            parts.append(self.generation_prompt_text())
        return "".join(parts)

    def _with_default_system(self, messages):
        messages = list(messages)
        for m in messages:
            if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
                raise ValueError(f"a message needs 'role' and 'content', got {m!r}")
        if self.default_system is not None and (
                not messages or messages[0]["role"] != "system"):
            messages.insert(0, {"role": "system", "content": self.default_system})
        return messages


def template_from_jinja(source: str | None) -> ChatTemplate:
    """A ChatML template matching a model's Jinja chat template string.

    Only the default system message is read from ``source`` (a literal
    ``<|im_start|>system\\n...<|im_end|>`` in it, as in SmolLM2's template);
    the rest is plain ChatML. Raises ValueError if ``source`` is not ChatML.
    """
    if not source:
        return ChatTemplate()
    if "<|im_start|>" not in source:
        raise ValueError("chat template is not ChatML (no <|im_start|>)")
    m = _DEFAULT_SYSTEM_RE.search(source)
    return ChatTemplate(default_system=m.group(1) if m else None)


def encode_message(tokenizer: Tokenizer, role: str, content: str,
                   template: ChatTemplate = ChatTemplate()) -> list[int]:
    """Token ids of one message (for appending a turn to a running context)."""
    return tokenizer.encode(template.message_text(role, content))


def generation_prompt(tokenizer: Tokenizer,
                      template: ChatTemplate = ChatTemplate()) -> list[int]:
    """Token ids of ``<|im_start|>assistant\\n``."""
    return tokenizer.encode(template.generation_prompt_text())


def encode_chat(tokenizer: Tokenizer, messages: Sequence[Mapping[str, str]], *,
                add_generation_prompt: bool = True,
                template: ChatTemplate = ChatTemplate()) -> list[int]:
    """Renders ``messages`` (dicts with ``role`` and ``content``) to ids.

    Returns ``list[int]``: the ChatML conversation, ending with the assistant
    generation prompt when ``add_generation_prompt``. Raises ValueError on a
    malformed message or unknown role.
    """
    return tokenizer.encode(template.render_text(messages, add_generation_prompt))
