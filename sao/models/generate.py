"""Jitted prefill, KV-cache decode, sampling and a `generate` loop.

Reported log-probs: the log-prob of the chosen token under the distribution
it was drawn from, ``log_softmax(logits / temperature)`` AFTER top-p / top-k
truncation (renormalised over the kept tokens). That is the behaviour
policy of an importance ratio (DIS, PPO clip against the engine's log-probs):
the learner's ``token_logprobs(model, tokens, temperature=T)`` is the
untruncated target policy, and at lag 0 their ratio is the truncation's own
``p / p_kept <= 1``. Without truncation (``top_p >= 1``, ``top_k <= 0``) both
are the same numbers. Temperature 0 means greedy; greedy rows report
``log_softmax(logits)`` (T = 1).

`prefill` / `decode_step` take the NNX model, split it and call pure jitted
functions (`decode_step` donates the cache). Rows are independent: each row
has its own length / position, so an engine can prefill one row (batch 1) and
copy it in with `write_cache_row` while other rows keep decoding.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sao.models.cache import KVCache, fill_cache, init_cache


class GenerateOutput(NamedTuple):
    """tokens: i32[B, N] generated ids (``pad_id`` after a row's end);
    logprobs: f32[B, N] at the sampling temperature (0 after the end);
    lengths: i32[B] generated tokens per row, stop token included;
    finished: bool[B] True if a stop token ended the row ("stop"), False if
    ``max_new_tokens`` did ("length")."""

    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    finished: jax.Array


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _row_param(x, b: int, dtype) -> jax.Array:
    return jnp.broadcast_to(jnp.asarray(x, dtype), (b,))


def sample_tokens(rng: jax.Array, logits: jax.Array, temperature=1.0, top_p=1.0, top_k=0,
                  *, truncate: bool = True):
    """Samples one token per row.

    Args:
      rng: PRNG key.
      logits: f32[B, V].
      temperature, top_p, top_k: scalars or per-row arrays [B]; temperature
        <= 0 = greedy, top_p >= 1 and top_k <= 0 disable truncation.
      truncate: False skips the top-p/top-k code (a static speed switch).
    Returns:
      (tokens i32[B], logprobs f32[B]) with logprobs of the distribution the
      token was drawn from: ``log_softmax(logits / temperature)`` with the
      tokens cut by top-k / top-p at ``-inf`` (ties at a cut are kept), so the
      kept tokens renormalise; greedy rows: ``log_softmax(logits)`` (T = 1).
    """
    b = logits.shape[0]
    temperature = _row_param(temperature, b, jnp.float32)
    greedy = temperature <= 0
    scaled = logits.astype(jnp.float32) / jnp.where(greedy, 1.0, temperature)[:, None]
    logp = jax.nn.log_softmax(scaled, axis=-1)
    masked = scaled
    if truncate:
        top_k = _row_param(top_k, b, jnp.int32)
        top_p = _row_param(top_p, b, jnp.float32)
        desc = -jnp.sort(-scaled, axis=-1)
        kth = jnp.take_along_axis(desc, jnp.clip(top_k - 1, 0, scaled.shape[-1] - 1)[:, None], -1)
        masked = jnp.where((top_k[:, None] > 0) & (scaled < kth), -jnp.inf, masked)
        desc_m = -jnp.sort(-masked, axis=-1)
        probs = jax.nn.softmax(desc_m, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each entry
        keep = (before < top_p[:, None]) | (top_p[:, None] >= 1.0)
        threshold = jnp.min(jnp.where(keep, desc_m, jnp.inf), axis=-1, keepdims=True)
        masked = jnp.where(masked < threshold, -jnp.inf, masked)
    drawn = jax.random.categorical(rng, masked, axis=-1)
    tokens = jnp.where(greedy, jnp.argmax(scaled, axis=-1), drawn).astype(jnp.int32)
    sampled = jax.nn.log_softmax(masked, axis=-1) if truncate else logp  # what `drawn` came from
    chosen = jnp.where(greedy[:, None], logp, sampled)
    return tokens, jnp.take_along_axis(chosen, tokens[:, None], -1)[:, 0]


def _prefill(model, tokens, lengths, cache):
    b = tokens.shape[0]
    hidden, kvs, _ = model.forward(tokens)
    cache = fill_cache(cache, kvs)
    last = hidden[jnp.arange(b), lengths - 1]
    return model.logits_from_hidden(last), cache


def _decode(model, last_tokens, positions, cache):
    hidden, cache = model.decode_hidden(last_tokens[:, None], positions, cache)
    return model.logits_from_hidden(hidden[:, 0]), cache


@functools.partial(jax.jit, static_argnums=0)
def _prefill_jit(graphdef, state, tokens, lengths, cache):
    return _prefill(nnx.merge(graphdef, state), tokens, lengths, cache)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=4)
def _decode_jit(graphdef, state, last_tokens, positions, cache):
    return _decode(nnx.merge(graphdef, state), last_tokens, positions, cache)


def _check_lengths(tokens, lengths):
    if tokens.ndim != 2 or lengths.shape != tokens.shape[:1]:
        raise ValueError(f"need tokens i32[B, T] and lengths i32[B], got {tokens.shape}, {lengths.shape}")
    if _is_concrete(lengths):
        ln = np.asarray(lengths)
        if ln.min() < 1 or ln.max() > tokens.shape[1]:
            raise ValueError(f"lengths must be in [1, {tokens.shape[1]}], got {ln.min()}..{ln.max()}")


def prefill(model, tokens: jax.Array, lengths: jax.Array, cache: KVCache):
    """Runs the prompts and fills cache slots [0, T).

    Args:
      model: `Transformer`; tokens: i32[B, T] right-padded prompts;
      lengths: i32[B] prompt lengths (1..T); cache: from `init_cache`, S >= T.
    Returns:
      (logits f32[B, V] at position ``lengths - 1``, cache).
    Raises:
      ValueError: bad shapes, lengths out of range, or T > cache length.
    """
    tokens, lengths = jnp.asarray(tokens, jnp.int32), jnp.asarray(lengths, jnp.int32)
    _check_lengths(tokens, lengths)
    graphdef, state = nnx.split(model)
    return _prefill_jit(graphdef, state, tokens, lengths, cache)


def decode_step(model, last_tokens: jax.Array, positions: jax.Array, cache: KVCache):
    """One decode step for every row (the cache argument is donated).

    Args:
      last_tokens: i32[B] the newest token of each row; positions: i32[B] its
        position (its key/value go to that slot; it attends to slots <= it).
    Returns:
      (logits f32[B, V] for the next token, cache).
    """
    graphdef, state = nnx.split(model)
    return _decode_jit(graphdef, state, jnp.asarray(last_tokens, jnp.int32),
                       jnp.asarray(positions, jnp.int32), cache)


def _stop_array(stop_token_ids, b: int) -> jax.Array:
    arr = np.asarray(stop_token_ids if stop_token_ids is not None else [], dtype=np.int32)
    if arr.ndim == 1:
        arr = np.broadcast_to(arr[None], (b, arr.shape[0]))
    if arr.ndim != 2 or arr.shape[0] != b:
        raise ValueError(f"stop_token_ids must be a list of ids or i32[B, S] (-1 padded), got {arr.shape}")
    if arr.shape[1] == 0:
        arr = np.full((b, 1), -1, np.int32)
    return jnp.asarray(arr)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "truncate", "pad_id",
                                             "cache_dtype"))
def _generate_jit(state, prompt, lengths, rng, temperature, top_p, top_k, stop_ids, *,
                  graphdef, max_new_tokens, truncate, pad_id, cache_dtype):
    model = nnx.merge(graphdef, state)
    b, p = prompt.shape
    cache = init_cache(model.cfg, b, p + max_new_tokens, cache_dtype)
    logits, cache = _prefill(model, prompt, lengths, cache)
    out_tok = jnp.full((b, max_new_tokens), pad_id, jnp.int32)
    out_lp = jnp.zeros((b, max_new_tokens), jnp.float32)
    zeros_b = jnp.zeros((b,), jnp.int32)
    init = (jnp.int32(0), logits, cache, rng, jnp.zeros((b,), bool), zeros_b, out_tok, out_lp)

    def cond(carry):
        i, _, _, _, done, _, _, _ = carry
        return (i < max_new_tokens) & ~jnp.all(done)

    def body(carry):
        i, logits, cache, rng, done, n_gen, out_tok, out_lp = carry
        rng, sub = jax.random.split(rng)
        tok, lp = sample_tokens(sub, logits, temperature, top_p, top_k, truncate=truncate)
        active = ~done
        out_tok = out_tok.at[:, i].set(jnp.where(active, tok, pad_id))
        out_lp = out_lp.at[:, i].set(jnp.where(active, lp, 0.0))
        n_gen = n_gen + active.astype(jnp.int32)
        done = done | (active & jnp.any(tok[:, None] == stop_ids, axis=-1))
        logits, cache = _decode(model, tok, lengths + i, cache)
        return i + 1, logits, cache, rng, done, n_gen, out_tok, out_lp

    _, _, _, _, done, n_gen, out_tok, out_lp = jax.lax.while_loop(cond, body, init)
    return GenerateOutput(out_tok, out_lp, n_gen, done)


def generate(model, prompt_tokens: jax.Array, prompt_lengths: jax.Array, *, rng: jax.Array,
             max_new_tokens: int, temperature=1.0, top_p=1.0, top_k=0,
             stop_token_ids: Sequence[int] | np.ndarray | None = (), pad_id: int = 0,
             cache_dtype=None) -> GenerateOutput:
    """Batched sampling with a KV cache (`jax.lax.while_loop`, stops early when
    every row is done).

    Args:
      model: `Transformer`.
      prompt_tokens: i32[B, P] right-padded; prompt_lengths: i32[B] in [1, P].
      rng: PRNG key (explicit; same key, same output).
      max_new_tokens: N, generation budget per row.
      temperature, top_p, top_k: scalars or per-row [B] (see `sample_tokens`).
      stop_token_ids: ids shared by all rows, or per-row i32[B, S] padded with -1;
        the stop token is emitted and counted in ``lengths``.
      pad_id: filler after a row's end.
      cache_dtype: KV cache dtype (default: model compute dtype).
    Returns:
      `GenerateOutput`.
    Raises:
      ValueError: bad shapes, lengths out of range, max_new_tokens < 1.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    prompt = jnp.asarray(prompt_tokens, jnp.int32)
    lengths = jnp.asarray(prompt_lengths, jnp.int32)
    _check_lengths(prompt, lengths)
    truncate = not (isinstance(top_p, (int, float)) and top_p >= 1.0
                    and isinstance(top_k, int) and top_k <= 0)
    graphdef, state = nnx.split(model)
    return _generate_jit(state, prompt, lengths, rng, jnp.asarray(temperature, jnp.float32),
                         jnp.asarray(top_p, jnp.float32), jnp.asarray(top_k, jnp.int32),
                         _stop_array(stop_token_ids, prompt.shape[0]), graphdef=graphdef,
                         max_new_tokens=int(max_new_tokens), truncate=truncate,
                         pad_id=int(pad_id),
                         cache_dtype=None if cache_dtype is None else jnp.dtype(cache_dtype).name)
