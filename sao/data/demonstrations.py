"""Tool-integrated SFT demonstrations built from reasoning-gym arithmetic tasks.

A demonstration answers a prompt such as ``"Calculate 37 + 45 * 2."`` in one
of two ways (byte-level tool format, docs/envs.md)::

    tool:    <python>print(37 + 45 * 2)</python><output>127</output><answer>127</answer>
    direct:  <answer>127</answer>

Only a fraction ``tool_fraction`` of the demonstrations use the tool, chosen at
random independently of the prompt, so the warm-started policy calls the tool
about that often. A tiny model cannot do the direct (mental) arithmetic, so it
is mostly wrong there: RL has something to learn, namely *when to call the
tool* (the quick start, experiments/quickstart.py).

The ``<output>`` span is what the environment inserts (an observation): it
gets ``loss_mask`` 0, like the prompt. Every other response token is an action
and gets ``loss_mask`` 1. Answers and tool outputs are computed by Python on
the expression (the dataset's answer is checked against it), so demonstrations
are always correct.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable, Sequence

import numpy as np

# The reasoning-gym generator settings of the quick start: 2-3 terms of 1-2
# digits, no division (integer answers), no negation (short
# prompts, <= ~96 bytes per demonstration).
QUICKSTART_TASK_KWARGS: dict[str, Any] = dict(
    min_terms=2, max_terms=3, min_digits=1, max_digits=2,
    operators=("+", "-", "*"), allow_parentheses=True, allow_negation=False)


@dataclasses.dataclass(frozen=True)
class Demonstration:
    """One SFT example: ``prompt`` (text) and response spans.

    Attributes:
      prompt: the task question exactly as the environment shows it.
      spans: ``[(text, is_action), ...]`` after the prompt; observation spans
        (tool output) have ``is_action`` False.
      uses_tool: whether the response calls the Python tool.
      answer: the reference answer (string).
    """

    prompt: str
    spans: tuple[tuple[str, bool], ...]
    uses_tool: bool
    answer: str

    @property
    def response_text(self) -> str:
        return "".join(text for text, _ in self.spans)


def default_prompt_text(question: str) -> str:
    """The prompt shown to the tiny policy: the question and a newline.

    This is what an env built with ``env.prompt_style="question"`` returns from
    ``reset`` (``sao.components.make_env_factory``); the agent loop encodes
    it without ``<bos>``, so demonstrations are tokenised without it too.
    The observation ``<output>127</output>`` matches the agent loop's framing of
    ``sao.envs.tools.render_tool_result`` (stdout without its final newline).
    """
    return question + "\n"


# Final-answer styles of the online drift env (sao.envs.judges.STYLES), as demonstrated.
ANSWER_STYLES = {"bare": "{}", "sentence": "The answer is {}.", "boxed": "\\boxed{{{}}}"}


def parse_style_mix(spec: str) -> dict[str, float]:
    """``"bare:0.7,sentence:0.15,boxed:0.15"`` -> weights summing to 1 ({} for "").

    Raises ValueError on an unknown style, a negative weight or an all-zero mix."""
    if not spec.strip():
        return {}
    mix = {}
    for part in spec.split(","):
        name, _, w = part.partition(":")
        name = name.strip()
        if name not in ANSWER_STYLES:
            raise ValueError(f"unknown answer style {name!r}; expected {sorted(ANSWER_STYLES)}")
        mix[name] = float(w)
        if mix[name] < 0:
            raise ValueError(f"style weight must be >= 0, got {part!r}")
    total = sum(mix.values())
    if total <= 0:
        raise ValueError(f"style mix {spec!r} has no weight")
    return {k: v / total for k, v in mix.items()}


def make_demonstration(question: str, expression: str, answer: str, *, use_tool: bool,
                       prompt_text: Callable[[str], str] = default_prompt_text,
                       style: str = "bare") -> Demonstration:
    """Builds one demonstration whose final answer is in ``style`` (``ANSWER_STYLES``);
    raises ValueError if ``expression`` does not evaluate to ``answer`` or on an unknown style."""
    value = _evaluate(expression)
    if str(value) != str(answer).strip():
        raise ValueError(f"expression {expression!r} evaluates to {value}, dataset says {answer!r}")
    if style not in ANSWER_STYLES:
        raise ValueError(f"unknown answer style {style!r}; expected {sorted(ANSWER_STYLES)}")
    final = f"<answer>{ANSWER_STYLES[style].format(value)}</answer>"
    if use_tool:
        spans = ((f"<python>print({expression})</python>", True),
                 (f"<output>{value}</output>", False),
                 (final, True))
    else:
        spans = ((final, True),)
    return Demonstration(prompt_text(question), spans, use_tool, str(value))


def _evaluate(expression: str) -> int:
    """Evaluates + - * integer arithmetic; raises ValueError on anything else."""
    allowed = set("0123456789+-* ()")
    if not expression or set(expression) - allowed:
        raise ValueError(f"unsupported expression {expression!r}")
    return int(eval(expression, {"__builtins__": {}}, {}))  # noqa: S307 - charset checked above


def arithmetic_demonstrations(num: int, *, seed: int, tool_fraction: float,
                              task: str = "basic_arithmetic",
                              task_kwargs: dict[str, Any] | None = None,
                              prompt_text: Callable[[str], str] = default_prompt_text,
                              style_mix: dict[str, float] | None = None,
                              ) -> list[Demonstration]:
    """``num`` demonstrations from a reasoning-gym task (``basic_arithmetic`` or ``chain_sum``).

    Args:
      num: number of demonstrations (> 0).
      seed: dataset seed; use one disjoint from the RL / held-out prompt seeds.
      tool_fraction: probability in [0, 1] that a demonstration calls the tool.
      task_kwargs: generator settings (default ``QUICKSTART_TASK_KWARGS``).
      style_mix: ``{style: weight}`` of the final answers' styles (`parse_style_mix`),
        drawn per demonstration; None / {} = all ``"bare"``. A warm start that has
        seen every style can sample the one a drifted reward wants.
    Raises ValueError on a bad ``num`` / ``tool_fraction`` or an expression
    that is not + - * integer arithmetic.
    """
    import reasoning_gym as rg
    if num <= 0:
        raise ValueError(f"num must be positive, got {num}")
    if not 0.0 <= tool_fraction <= 1.0:
        raise ValueError(f"tool_fraction must be in [0, 1], got {tool_fraction}")
    kwargs = dict(QUICKSTART_TASK_KWARGS if task_kwargs is None else task_kwargs)
    if task == "chain_sum":  # chain_sum has no operator / parentheses options
        kwargs = {k: v for k, v in kwargs.items() if k in ("min_terms", "max_terms",
                                                             "min_digits", "max_digits")}
    dataset = rg.create_dataset(task, size=num, seed=seed, **kwargs)
    rng = random.Random(seed)
    styles, weights = zip(*style_mix.items()) if style_mix else (("bare",), (1.0,))
    style_rng = random.Random(seed + 1)     # separate stream: the tool choices stay as before
    return [make_demonstration(entry["question"], entry["metadata"]["expression"],
                               entry["answer"], use_tool=rng.random() < tool_fraction,
                               prompt_text=prompt_text,
                               style=style_rng.choices(styles, weights)[0])
            for entry in dataset]


@dataclasses.dataclass
class SFTArrays:
    """Tokenised demonstrations, right-padded.

    Attributes:
      tokens: i32[N, T] (prompt + response, then ``pad_id``; ``<bos>`` first if asked).
      loss_mask: bool[N, T], True on action tokens (the targets of the loss).
      lengths: i32[N] number of real tokens per row.
      uses_tool: bool[N].
    """

    tokens: np.ndarray
    loss_mask: np.ndarray
    lengths: np.ndarray
    uses_tool: np.ndarray


def tokenize_demonstrations(demos: Sequence[Demonstration], tokenizer, *, max_len: int,
                            add_bos: bool = False) -> SFTArrays:
    """Token ids and action masks of demonstrations (token-in/token-out layout).

    Raises ValueError if a demonstration is longer than ``max_len`` tokens.
    """
    n = len(demos)
    tokens = np.full((n, max_len), tokenizer.pad_id, dtype=np.int32)
    mask = np.zeros((n, max_len), dtype=bool)
    lengths = np.zeros(n, dtype=np.int32)
    for i, demo in enumerate(demos):
        ids = tokenizer.encode(demo.prompt, add_bos=add_bos)
        acts = [False] * len(ids)
        for text, is_action in demo.spans:
            piece = tokenizer.encode(text)
            ids += piece
            acts += [is_action] * len(piece)
        if len(ids) > max_len:
            raise ValueError(f"demonstration {i} has {len(ids)} tokens > max_len={max_len}: "
                             f"{demo.prompt + demo.response_text!r}")
        tokens[i, :len(ids)] = ids
        mask[i, :len(ids)] = acts
        lengths[i] = len(ids)
    return SFTArrays(tokens, mask, lengths, np.array([d.uses_tool for d in demos], dtype=bool))
