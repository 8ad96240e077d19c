"""KV-cache generation: cached log-probs equal a full forward, greedy, stop
tokens, truncation, row independence (continuous batching)."""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sampling_reference import truncated_logprobs
from sao.models import (Transformer, decode_step, generate, get_preset, init_cache, prefill,
                        sample_tokens, token_logprobs, write_cache_row)

PROMPTS = np.array([[257, 72, 105, 33, 0, 0], [257, 50, 43, 50, 61, 63]], np.int32)
LENGTHS = np.array([4, 6], np.int32)


NO_STOP = np.full((2, 2), -1, np.int32)  # one stop-array shape for all tests: one compile
N_NEW = 10


@pytest.fixture(scope="module")
def model():
    return Transformer(get_preset("tiny"), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def forward(model):
    """Jitted full forward on a fixed width (16): causal, so right padding
    does not change the logits of earlier positions."""
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda st, t: nnx.merge(graphdef, st)(t))

    def run(rows):
        batch = np.zeros((len(rows), 16), np.int32)
        for i, r in enumerate(rows):
            batch[i, :len(r)] = r
        return np.asarray(fn(state, jnp.asarray(batch)))
    return run


def _full_sequences(out, prompts=PROMPTS, lengths=LENGTHS):
    """Concatenates prompt[:len] + generated[:n] per row, right-padded."""
    rows = [np.concatenate([p[:l], g[:n]]) for p, l, g, n in
            zip(prompts, lengths, np.asarray(out.tokens), np.asarray(out.lengths))]
    width = max(len(r) for r in rows)
    return np.stack([np.pad(r, (0, width - len(r))) for r in rows]), rows


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_cached_logprobs_equal_full_forward(model, temperature):
    out = generate(model, PROMPTS, LENGTHS, rng=jax.random.key(0), max_new_tokens=N_NEW,
                   temperature=temperature, stop_token_ids=NO_STOP)
    assert out.tokens.shape == (2, N_NEW) and out.logprobs.dtype == jnp.float32
    seqs, rows = _full_sequences(out)
    lp = np.asarray(token_logprobs(model, jnp.asarray(seqs), temperature=temperature))
    for b, row in enumerate(rows):
        n, start = int(out.lengths[b]), LENGTHS[b]
        np.testing.assert_allclose(out.logprobs[b, :n], lp[b, start:start + n], atol=1e-5)
        assert np.all(np.asarray(out.logprobs[b, n:]) == 0)


def test_greedy_is_argmax_of_full_forward(model, forward):
    out = generate(model, PROMPTS, LENGTHS, rng=jax.random.key(1), max_new_tokens=N_NEW,
                   temperature=0.0, stop_token_ids=NO_STOP)
    _, rows = _full_sequences(out)
    logits = forward(rows)
    for b, row in enumerate(rows):
        for t in range(LENGTHS[b], len(row)):
            assert row[t] == logits[b, t - 1].argmax()
    # top_k=1 samples greedily too, whatever the temperature
    out_k1 = generate(model, PROMPTS, LENGTHS, rng=jax.random.key(2), max_new_tokens=N_NEW,
                      temperature=1.5, top_k=1, stop_token_ids=NO_STOP)
    np.testing.assert_array_equal(out_k1.tokens, out.tokens)


def test_same_key_same_output_and_stop_tokens(model):
    kw = dict(rng=jax.random.key(4), max_new_tokens=N_NEW, temperature=1.0)
    a = generate(model, PROMPTS, LENGTHS, stop_token_ids=NO_STOP, **kw)
    b = generate(model, PROMPTS, LENGTHS, stop_token_ids=NO_STOP, **kw)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert not np.any(a.finished) and np.all(np.asarray(a.lengths) == N_NEW)
    # Per-row stop sets: row 0 stops at its 3rd token, row 1 at its 5th.
    stops = np.array([[int(a.tokens[0, 2]), -1], [int(a.tokens[1, 4]), 999]], np.int32)
    first0 = list(np.asarray(a.tokens[0])).index(stops[0, 0]) + 1
    first1 = list(np.asarray(a.tokens[1])).index(stops[1, 0]) + 1
    c = generate(model, PROMPTS, LENGTHS, stop_token_ids=stops, **kw)
    np.testing.assert_array_equal(c.lengths, [first0, first1])
    assert np.all(c.finished)
    np.testing.assert_array_equal(c.tokens[0, :first0], a.tokens[0, :first0])
    np.testing.assert_array_equal(c.tokens[0, first0:], 0)


def test_sample_tokens_truncation():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 2000))
    keys = jax.random.key(0)
    tok, lp = sample_tokens(keys, logits, 1.0, 1.0, 2)
    assert set(np.unique(tok)) == {0, 1}
    np.testing.assert_allclose(lp, np.log(np.array([0.5, 0.3]) / 0.8)[np.asarray(tok)],
                               atol=1e-6)  # the log-prob of the top-2 distribution drawn from
    tok, _ = sample_tokens(keys, logits, 1.0, 0.7, 0)  # 0.5 + 0.3 reaches 0.7
    assert set(np.unique(tok)) == {0, 1}
    tok, _ = sample_tokens(keys, logits, 1.0, 0.85, 0)
    assert set(np.unique(tok)) == {0, 1, 2}
    tok, lp = sample_tokens(keys, logits, jnp.zeros((2000,)), 1.0, 0)
    assert np.all(np.asarray(tok) == 0)
    freq = np.bincount(np.asarray(sample_tokens(keys, logits)[0]), minlength=4) / 2000
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.04)


def test_refill_one_row_while_others_decode(model, forward):
    """Continuous batching: row 1 restarts with a new prompt mid-stream."""
    cache = init_cache(model.cfg, 2, 16)
    logits, cache = prefill(model, PROMPTS, LENGTHS, cache)
    pos = jnp.asarray(LENGTHS)
    tok = jnp.argmax(logits, -1).astype(jnp.int32)
    emitted0 = []
    for _ in range(2):
        emitted0.append(tok[0])
        logits, cache = decode_step(model, tok, pos, cache)
        pos, tok = pos + 1, jnp.argmax(logits, -1).astype(jnp.int32)
    new_prompt = np.array([[257, 99, 98, 0, 0, 0]], np.int32)
    row_logits, row_cache = prefill(model, new_prompt, np.array([3]), init_cache(model.cfg, 1, 16))
    cache = write_cache_row(cache, jnp.int32(1), row_cache)
    tok = tok.at[1].set(jnp.argmax(row_logits[0]).astype(jnp.int32))
    pos = pos.at[1].set(3)
    seq0 = list(PROMPTS[0, :4])
    seq1 = [257, 99, 98]
    seq0 += [int(t) for t in emitted0] + [int(tok[0])]
    seq1 += [int(tok[1])]
    logits, cache = decode_step(model, tok, pos, cache)
    # Compare both rows with independent full forwards.
    full = forward([seq0, seq1])
    np.testing.assert_allclose(logits[0], full[0, len(seq0) - 1], atol=1e-5)
    np.testing.assert_allclose(logits[1], full[1, len(seq1) - 1], atol=1e-5)
    gen_mod = importlib.import_module("sao.models.generate")
    assert gen_mod._decode_jit._cache_size() == 1  # recompile guard: one trace


def test_bad_arguments(model):
    with pytest.raises(ValueError, match="lengths"):
        generate(model, PROMPTS, np.array([0, 3]), rng=jax.random.key(0), max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, PROMPTS, LENGTHS, rng=jax.random.key(0), max_new_tokens=0)
    with pytest.raises(ValueError, match="max_len"):
        prefill(model, PROMPTS, LENGTHS, init_cache(model.cfg, 2, 4))
    with pytest.raises(ValueError, match="row cache"):
        write_cache_row(init_cache(model.cfg, 2, 16), 0, init_cache(model.cfg, 1, 8))


@pytest.mark.parametrize("temperature,top_p,top_k", [
    (1.0, 1.0, 0), (0.7, 0.9, 0), (1.3, 1.0, 5), (1.0, 0.6, 7), (0.5, 0.95, 3), (1.0, 0.3, 0)])
def test_sample_tokens_reports_the_logprob_of_the_distribution_sampled(temperature, top_p, top_k):
    # Random logits with ties, against the NumPy reference of the truncated distribution:
    # every drawn token is kept by the reference, its log-prob is the reference's, and the
    # empirical frequencies follow exp(reference).
    rng = np.random.default_rng(int(100 * temperature + 10 * top_p + top_k))
    row = np.round(rng.normal(size=12) * 2, 1).astype(np.float32)
    row[3] = row[7]                                          # a tie
    n = 4000
    tok, lp = sample_tokens(jax.random.key(1), jnp.asarray(np.tile(row, (n, 1))),
                            temperature, top_p, top_k)
    ref = truncated_logprobs(row, temperature, top_p, top_k)
    tok = np.asarray(tok)
    assert np.all(np.isfinite(ref[tok]))
    np.testing.assert_allclose(np.asarray(lp), ref[tok], atol=2e-5)
    np.testing.assert_allclose(np.bincount(tok, minlength=12) / n, np.exp(ref), atol=0.03)
