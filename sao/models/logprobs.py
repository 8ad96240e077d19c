"""Per-token log-probs, entropies and values, aligned as in architecture.md.

``out[:, t]`` belongs to token ``t``: the log-prob of ``tokens[:, t]`` given
``tokens[:, :t]`` (logits at ``t - 1``), or the critic's value of the state
before token ``t`` (value head at ``t - 1``). Column 0 is 0.

The LM head (operands in ``ModelConfig.head_dtype``, float32 by default;
float32 accumulation and logits) and the log-softmax (float32) run over
chunks of ``chunk`` time steps (`jax.lax.map` + `jax.checkpoint`), so neither
the forward nor the backward pass holds more than one ``[B, chunk, V]`` block
of logits. Log-probs are of ``softmax(logits / temperature)``: the sampling
distribution before any top-p / top-k truncation, which is what the engine
reports (generate.py), so learner and engine agree.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from sao.models.mixed import transposed_dot

DEFAULT_CHUNK = 128
# The backward pass reuses the forward's f32 logits when all of them take at
# most this many bytes, and recomputes them block by block otherwise.
SAVE_LOGITS_MAX_BYTES = 2 ** 28


def _check_temperature(temperature):
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")


def _logits(h, w, head_dtype):
    """h [B, c, D] x w f32[D, V] with ``head_dtype`` operands -> f32[B, c, V]."""
    hd = jnp.dtype(head_dtype)
    return jnp.einsum("bcd,dv->bcv", h.astype(hd), w.astype(hd), preferred_element_type=jnp.float32)


def _chunk_forward(h, t, w, inv_t, head_dtype):
    """One block: h [B, c, D], t i32[B, c] -> (logits f32[B, c, V], logz, logprobs, entropy)."""
    logits = _logits(h, w, head_dtype) * inv_t
    top = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    shifted = logits - top
    e = jnp.exp(shifted)
    # sum(e) and sum(e * shifted) in one pass over the block (one exp per entry).
    total, weighted = jax.lax.reduce((e, e * shifted), (0.0, 0.0),
                                     lambda a, b: (a[0] + b[0], a[1] + b[1]), (2,))
    logz = jnp.log(total) + top[..., 0]
    picked = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
    entropy = jnp.log(total) - weighted / total
    return logits, logz, picked - logz, entropy


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _head(save_logits: bool, head_dtype: str, hs, ts, w, inv_t):
    """Blocks hs [n, B, c, D], ts i32[n, B, c], w f32[D, V], inv_t f32[] ->
    (logprobs f32[n, B, c], entropy f32[n, B, c]). ``save_logits``: keep every
    block's logits for the backward pass instead of recomputing them;
    ``head_dtype``: the head matmul's operand dtype."""
    return _head_fwd(save_logits, head_dtype, hs, ts, w, inv_t)[0]


def _head_fwd(save_logits, head_dtype, hs, ts, w, inv_t):
    def one(args):
        logits, logz, lp, ent = _chunk_forward(*args, w, inv_t, head_dtype)
        return lp, ent, logz, logits if save_logits else None

    lp, ent, logz, logits = jax.lax.map(one, (hs, ts))
    return (lp, ent), (hs, ts, w, inv_t, logz, ent, logits)


def _head_bwd(save_logits, head_dtype, res, cts):
    """Per block, the logits (saved or recomputed in f32) give d/dlogits of
    ``lp = logits[t] - logz`` and ``ent = logz - sum p*logits`` in one pass:
    ``g_lp * (onehot - p) + g_ent * p * (logz - ent - logits)``. The two
    products with it (hidden and head gradients) take the hidden states'
    dtype with f32 accumulation: bf16 under mixed precision, f32 otherwise."""
    del save_logits
    hs, ts, w, inv_t, logz, ent, saved = res
    g_lp, g_ent = cts
    cd = hs.dtype
    w_cd = w.astype(cd)

    def one(carry, args):
        dw, dinv = carry
        h, t, lz, en, glp, gent, logits = args
        if logits is None:
            logits = _logits(h, w, head_dtype) * inv_t
        hit = jnp.arange(logits.shape[-1], dtype=t.dtype) == t[..., None]
        probs = jnp.exp(logits - lz[..., None])
        dlogits = (jnp.where(hit, glp[..., None], 0.0) - glp[..., None] * probs
                   + gent[..., None] * probs * ((lz - en)[..., None] - logits))
        draw = (dlogits * inv_t).astype(cd)
        dh = jnp.einsum("bcv,dv->bcd", draw, w_cd, preferred_element_type=jnp.float32)
        b, c, v = draw.shape
        dw = dw + transposed_dot(h.reshape(b * c, -1), draw.reshape(b * c, v))
        return (dw, dinv + jnp.sum(dlogits * logits) / inv_t), dh.astype(h.dtype)

    init = (jnp.zeros(w.shape, jnp.float32), jnp.zeros((), jnp.float32))
    (dw, dinv), dhs = jax.lax.scan(one, init, (hs, ts, logz, ent, g_lp, g_ent, saved))
    return dhs, None, dw.astype(w.dtype), dinv.astype(jnp.result_type(inv_t))


_head.defvjp(_head_fwd, _head_bwd)


def _chunked_logprobs(hidden: jax.Array, targets: jax.Array, head_kernel: jax.Array,
                      temperature, chunk: int, head_dtype: str = "float32"):
    """hidden [B, N, D], targets i32[B, N] -> (logprobs f32[B, N], entropy f32[B, N]).

    A custom VJP (`_head`) instead of ``jax.checkpoint`` around autodiff: the
    backward pass recomputes a block's logits once and forms d/dlogits in one
    elementwise pass (autodiff's gather gradient was a scatter into
    [B, c, V] plus layout copies), and accumulates the head's gradient in the
    same loop."""
    b, n, d = hidden.shape
    save = b * n * head_kernel.shape[-1] * 4 <= SAVE_LOGITS_MAX_BYTES
    c = max(1, n if save else min(chunk, n))
    pad = (-n) % c
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
    nc = (n + pad) // c
    hs = hidden.reshape(b, nc, c, d).swapaxes(0, 1)
    ts = targets.reshape(b, nc, c).swapaxes(0, 1)
    inv_t = 1.0 / jnp.asarray(temperature, jnp.float32)
    lp, ent = _head(save, head_dtype, hs, ts, head_kernel.astype(jnp.float32), inv_t)
    lp = lp.swapaxes(0, 1).reshape(b, nc * c)[:, :n]
    ent = ent.swapaxes(0, 1).reshape(b, nc * c)[:, :n]
    return lp, ent


def _shift_right(x: jax.Array) -> jax.Array:
    return jnp.pad(x, ((0, 0), (1, 0)))


def token_logprobs_and_entropy(model, tokens: jax.Array, *, temperature=1.0,
                               positions: jax.Array | None = None,
                               chunk: int = DEFAULT_CHUNK):
    """Log-probs and entropies of ``softmax(logits / temperature)`` per token.

    Args:
      model: a `Transformer`.
      tokens: i32[B, T].
      temperature: > 0 (python or f32 scalar), the sampling temperature.
      positions: optional i32[B, T] RoPE positions (default arange).
      chunk: time steps per head/log-softmax block.
    Returns:
      (logprobs f32[B, T], entropy f32[B, T]); ``entropy[:, t]`` is the entropy
      of the distribution that ``tokens[:, t]`` was drawn from; column 0 = 0.
    Raises:
      ValueError: bad tokens shape/dtype or a non-positive python temperature.
    """
    _check_temperature(temperature)
    hidden = model.hidden_states(tokens, positions)
    lp, ent = _chunked_logprobs(hidden[:, :-1], tokens[:, 1:].astype(jnp.int32),
                                model.head_kernel(), temperature, chunk,
                                model.cfg.head_dtype)
    return _shift_right(lp), _shift_right(ent)


def token_logprobs(model, tokens: jax.Array, *, temperature=1.0,
                   positions: jax.Array | None = None, chunk: int = DEFAULT_CHUNK) -> jax.Array:
    """f32[B, T]: ``log softmax(logits[:, t-1] / temperature)[tokens[:, t]]``, col 0 = 0.

    See `token_logprobs_and_entropy` for arguments and errors.
    """
    return token_logprobs_and_entropy(model, tokens, temperature=temperature,
                                      positions=positions, chunk=chunk)[0]


def predict_values(critic, tokens: jax.Array, *, positions: jax.Array | None = None) -> jax.Array:
    """f32[B, T]: ``values[:, t]`` = value head at the hidden state of ``t - 1``; col 0 = 0.

    Args:
      critic: a `ValueModel`.
      tokens: i32[B, T].
    Raises:
      ValueError: bad tokens shape/dtype.
    """
    hidden = critic.hidden_states(tokens, positions)
    return _shift_right(critic.values_from_hidden(hidden[:, :-1]))
