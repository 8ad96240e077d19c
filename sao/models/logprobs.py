"""Per-token log-probs, entropies and values, aligned as in architecture.md.

``out[:, t]`` belongs to token ``t``: the log-prob of ``tokens[:, t]`` given
``tokens[:, :t]`` (logits at ``t - 1``), or the critic's value of the state
before token ``t`` (value head at ``t - 1``). Column 0 is 0.

The LM head and log-softmax run in float32 whatever the parameter dtype, over
chunks of ``chunk`` time steps (`jax.lax.map` + `jax.checkpoint`), so neither
the forward nor the backward pass holds more than one ``[B, chunk, V]`` block
of logits. Log-probs are of ``softmax(logits / temperature)``: the sampling
distribution before any top-p / top-k truncation, which is what the engine
reports (generate.py), so learner and engine agree.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

DEFAULT_CHUNK = 128


def _check_temperature(temperature):
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")


def _chunked_logprobs(hidden: jax.Array, targets: jax.Array, head_kernel: jax.Array,
                      temperature, chunk: int):
    """hidden [B, N, D], targets i32[B, N] -> (logprobs f32[B, N], entropy f32[B, N])."""
    b, n, d = hidden.shape
    c = max(1, min(chunk, n))
    pad = (-n) % c
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
    nc = (n + pad) // c
    hs = hidden.reshape(b, nc, c, d).swapaxes(0, 1)
    ts = targets.reshape(b, nc, c).swapaxes(0, 1)
    inv_t = 1.0 / jnp.asarray(temperature, jnp.float32)

    @jax.checkpoint
    def one(args):
        h, t = args
        logits = jnp.einsum("bcd,dv->bcv", h.astype(jnp.float32), head_kernel) * inv_t
        logz = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
        probs = jnp.exp(logits - logz[..., None])
        entropy = logz - jnp.sum(probs * logits, axis=-1)
        return picked - logz, entropy

    lp, ent = jax.lax.map(one, (hs, ts))
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
                                model.head_kernel(), temperature, chunk)
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
