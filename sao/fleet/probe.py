"""The parity gate's probe set and the learner's log-probs of it (``sao.fleet.parity``).

The probe set is a few fixed conversations, encoded with the run's tokenizer
in the run's turn format (the byte-level tags of the tiny models, or ChatML
with a Hermes tool call for chat models): a question, a tool call, its
output and an answer, so special tokens, tool tags and ordinary text are all
scored. It is the same on every process and every start (no randomness).

``ReferencePublisher`` wraps the run's publisher: each version it publishes
is also scored by the learner (``sao.models.token_logprobs`` at temperature
1 on the published params) and handed to the gate before the version is
pushed to any server.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from sao.fleet.parity import ParityGate

# (question, tool code, tool output, answer): the probe conversations.
PROBE_EXCHANGES = (
    ("What is 17 * 23?", "print(17 * 23)", "391", "391"),
    ("Sum the numbers 48, 1093 and 7.", "print(48 + 1093 + 7)", "1148", "1148"),
    ("Is 221 a prime number? Answer yes or no.",
     "print([d for d in range(2, 221) if 221 % d == 0])", "[13, 17]", "no"),
    ("Reverse the word 'parity'.", "print('parity'[::-1])", "ytirap", "ytirap"),
)


def _byte_text(question: str, code: str, output: str, answer: str) -> str:
    return (f"{question}\n<python>{code}</python><output>{output}\n</output>"
            f"<answer>{answer}</answer>")


def _chatml_messages(question: str, code: str, output: str, answer: str) -> list[dict]:
    call = '{"name": "python", "arguments": {"code": "%s"}}' % code.replace('"', '\\"')
    return [{"role": "user", "content": question},
            {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
            {"role": "user", "content": f"<tool_response>\n{output}\n</tool_response>"},
            {"role": "assistant", "content": f"The answer is {answer}."}]


def probe_sequences(tokenizer, *, tool_format: str, max_len: int) -> list[list[int]]:
    """The probe set: one id sequence per ``PROBE_EXCHANGES`` entry.

    Args:
      tokenizer: the run's (``sao.components.make_tokenizer``).
      tool_format: ``env.tool_format``: ``"tags"`` (byte-level models: BOS,
        text with tool tags, EOS) or a chat format (ChatML via
        ``sao.models.chat.encode_chat``, ending with the assistant turn).
      max_len: longest sequence (the engines' context, ``rollout.max_len``);
        longer ones are cut.
    Returns lists of >= 2 ids. Raises ValueError if ``max_len`` < 2.
    """
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2, got {max_len}")
    seqs = []
    for exchange in PROBE_EXCHANGES:
        if tool_format == "tags":
            ids = [tokenizer.bos_id, *tokenizer.encode(_byte_text(*exchange)), tokenizer.eos_id]
        else:
            from sao.models.chat import encode_chat
            ids = encode_chat(tokenizer, _chatml_messages(*exchange), add_generation_prompt=False)
        seqs.append([int(t) for t in ids[:max_len]])
    return seqs


def reference_logprobs(model_of: Callable[[Any], Any], params, sequences: Sequence[Sequence[int]],
                       *, score=None) -> list[np.ndarray]:
    """The learner's log-probs of ``sequences``: one f32[T_i] per sequence
    (``token_logprobs`` at temperature 1, entry 0 is 0).

    ``model_of(params)`` builds the policy module inside jit
    (``ModelDef.merge``); ``score`` is a jitted ``(params, tokens) ->
    f32[B, T]`` to reuse (``make_score(model_of)``). Collective on a
    multi-process learner: every process calls it.
    """
    from sao import multihost
    score = make_score(model_of) if score is None else score
    longest = max(map(len, sequences))
    width = max(16, 1 << (longest - 1).bit_length())      # one compile for a fixed probe set
    tokens = np.zeros((len(sequences), width), np.int32)
    for i, s in enumerate(sequences):
        tokens[i, :len(s)] = s
    out = np.asarray(multihost.gather_to_host(score(params, _replicated_like(params, tokens))),
                     np.float32)
    return [out[i, :len(s)] for i, s in enumerate(sequences)]


def _replicated_like(params, tokens: np.ndarray):
    """``tokens`` replicated over the mesh ``params`` live on (every process
    holds the same probe: a global array, as a multi-process jit needs), or
    as they are when the params carry no mesh."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec
    sharding = getattr(jax.tree.leaves(params)[0], "sharding", None)
    if not isinstance(sharding, NamedSharding):
        return tokens
    return jax.make_array_from_callback(tokens.shape, NamedSharding(sharding.mesh, PartitionSpec()),
                                        lambda index: tokens[index])


def make_score(model_of: Callable[[Any], Any]):
    """Jitted ``(params, tokens i32[B, T]) -> f32[B, T]`` log-probs at temperature 1."""
    import jax
    from sao.models import token_logprobs
    return jax.jit(lambda params, tokens: token_logprobs(model_of(params), tokens))


class ReferencePublisher:
    """``publish(states, version) -> uri`` that also sets ``gate``'s reference
    for ``version`` (once per version) before returning.

    Args:
      publish: the run's ``sao.publishing.Publisher``.
      params_of: ``params_of(states)`` -> the actor's params (a pytree).
      model_of: ``model_of(params)`` -> the policy module (inside jit).
      gate: the run's ``ParityGate``.
    """

    def __init__(self, publish: Callable[[Any, int], str], *, params_of: Callable[[Any], Any],
                 model_of: Callable[[Any], Any], gate: ParityGate):
        self.publish, self.params_of, self.gate = publish, params_of, gate
        self._score = make_score(model_of)
        self._model_of = model_of

    def __call__(self, states, version: int) -> str:
        uri = self.publish(states, version)
        if not self.gate.has_reference(version):
            self.gate.set_reference(version, reference_logprobs(
                self._model_of, self.params_of(states), self.gate.sequences, score=self._score))
        return uri
