"""Engine.score: the log-probs of given token sequences (the parity gate's probe).

JaxEngine's forced decoding through its own prefill / decode steps must equal
the learner's ``token_logprobs``, whatever weights it serves now; SGLangEngine
reads the server's prompt log-probs (a fake server here; the real servers in
test_sglang_server.py and test_sglang_real_server.py).
"""
import asyncio
import dataclasses
import functools

import jax

import numpy as np
import pytest
from aiohttp import web
from flax import nnx

from sao.models import Transformer, get_preset, token_logprobs
from sao.rollout import EngineError
from sao.rollout.jax_engine import JaxEngine
from sao.rollout.scripted import ScriptedEngine
from test_sglang_client import FakeSGLang, run_with

CFG = dataclasses.replace(get_preset("tiny"), hidden_size=64, num_layers=2, num_heads=2,
                          num_kv_heads=1, intermediate_size=128)
SEQS = [[257, 72, 105, 33, 259, 40, 41, 260], [257, 1, 2], list(range(3, 40))]


@functools.partial(jax.jit, static_argnums=0)
def _logprobs(graphdef, params, tokens):
    return token_logprobs(nnx.merge(graphdef, params), tokens)


def learner_logprobs(model, seqs):
    """``token_logprobs`` of each sequence (padded to one width: one compile)."""
    tokens = np.zeros((len(seqs), 64), np.int32)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = s
    out = np.asarray(_logprobs(*nnx.split(model), tokens))
    return [out[i, :len(s)] for i, s in enumerate(seqs)]


def test_jax_engine_scores_as_the_learner_and_follows_its_weights():
    a, b = Transformer(CFG, rngs=nnx.Rngs(0)), Transformer(CFG, rngs=nnx.Rngs(1))

    async def main():
        engine = JaxEngine(a, max_slots=2, max_len=64)
        try:
            first = await engine.score(SEQS)
            await engine.set_params(1, nnx.state(b, nnx.Param))
            second = await engine.score(SEQS)
            with pytest.raises(ValueError, match="max_len"):
                await engine.score([list(range(65))])
            with pytest.raises(ValueError, match="vocab_size"):
                await engine.score([[1, 300]])
            with pytest.raises(ValueError, match=">= 2 ids"):
                await engine.score([[1]])
            return first, second
        finally:
            await engine.close()

    first, second = asyncio.run(main())
    for got, want in zip(first, learner_logprobs(a, SEQS)):
        assert got[0] == 0.0 and len(got) == len(want)
        np.testing.assert_allclose(got, want, atol=2e-5)
    for got, want in zip(second, learner_logprobs(b, SEQS)):
        np.testing.assert_allclose(got, want, atol=2e-5)
    assert max(abs(x - y) for x, y in zip(first[2], second[2])) > 1e-3  # other weights, other scores


def test_an_engine_without_scoring_says_so():
    with pytest.raises(NotImplementedError, match="cannot score"):
        asyncio.run(ScriptedEngine([]).score([[1, 2]]))


class ScoringFake(FakeSGLang):
    """Answers ``/generate`` with prompt log-probs ``-0.1 * position`` (or a
    broken answer); ids as both real servers report them: an id >=
    ``vocab_size - 1`` reads 0 (their clip; sao.rollout.sglang_engine)."""

    def __init__(self, broken: str = "", vocab_size: int = 1 << 20):
        super().__init__()
        self.broken, self.vocab_size = broken, vocab_size

    async def generate(self, request):
        body = await request.json()
        self.requests.append(body)
        ids = [t if t < self.vocab_size - 1 else 0 for t in body["input_ids"]]
        entries = [[None if i == 0 else -0.1 * i, t, None] for i, t in enumerate(ids)]
        if self.broken == "ids":
            entries[1][1] += 1
        elif self.broken == "zero":          # a 0 in place of an id that is not the largest
            entries[1][1] = 0
        elif self.broken == "repeated":
            entries = entries + entries[1:]
        elif self.broken == "missing":
            entries[2][0] = None
        elif self.broken == "absent":
            entries = None
        return web.json_response({"output_ids": [5], "meta_info": {
            "finish_reason": {"type": "length", "length": 1},
            "output_token_logprobs": [[-1.0, 5, None]], "input_token_logprobs": entries}})


def test_sglang_engine_reads_prompt_logprobs():
    fake = ScoringFake()
    out = run_with(fake, lambda e: e.score([[7, 8, 9], [1, 2]]))
    assert out == [[0.0, -0.1, -0.2], [0.0, -0.1]]
    sent = fake.requests[0]
    assert sent["return_logprob"] is True and sent["logprob_start_len"] == 0
    assert sent["sampling_params"] == {"temperature": 1.0, "max_new_tokens": 1}
    for broken in ("ids", "zero", "repeated", "missing", "absent"):
        with pytest.raises(EngineError, match="input_token_logprobs"):
            run_with(ScoringFake(broken), lambda e: e.score([[7, 8, 9]]))


def test_sglang_engine_scores_the_last_vocabulary_id():
    """The model's last id (the tiny Qwen3's ``</tool_response>``, in every
    ChatML probe) comes back as 0: scored, not refused (before the fix every
    SGLang server failed the parity gate on it)."""
    fake = ScoringFake(vocab_size=10)
    out = run_with(fake, lambda e: e.score([[7, 9, 8, 9], [9, 3]]))
    assert out == [[0.0, -0.1, -0.2, pytest.approx(-0.3)], [0.0, -0.1]]
    with pytest.raises(EngineError, match="differ from the scored sequence at 1 positions"):
        run_with(ScoringFake("zero", vocab_size=10), lambda e: e.score([[9, 7, 8]]))
