"""Value loss, KL estimators and entropy: per-token terms for the critic and
for baselines (SAO's own policy objective has no KL or entropy term,
docs/algorithm.md §4-5).

All outputs are f32 ``[B, T]`` per-token values, zero off the mask when a mask
is given; reduce them with :func:`sao.algo.aggregate`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from sao.algo.masked import as_f32, as_mask, check_same_shape, masked_mean

Array = jax.Array
KL_ESTIMATORS = ("k1", "k2", "k3", "k3_st")


def value_loss(values, returns, action_mask, *, old_values=None,
               clip_range: float | None = None) -> tuple[Array, dict[str, Array]]:
    """Critic loss ``0.5 (V - R)^2`` per action token (docs/algorithm.md §5).

    With ``clip_range`` (and ``old_values``) the PPO-style clipped value loss
    ``0.5 max((V - R)^2, (V_clip - R)^2)``, ``V_clip = V_old + clip(V - V_old,
    -c, c)``.

    Args:
      values: f32/bf16[B, T] critic outputs (differentiated).
      returns: f32[B, T] targets (no gradient).
      action_mask: bool[B, T].
      old_values: f32[B, T] values at rollout / step start; required with
        ``clip_range``.
      clip_range: optional positive clip half-width.

    Returns:
      ``(loss f32[B, T], diagnostics)``: ``value_clip_fraction`` (fraction of
      action tokens where the clipped branch is taken, 0 without clipping),
      ``value_mean``, ``return_mean``.

    Raises:
      ValueError: on shape mismatch, ``clip_range`` without ``old_values`` or a
        non-positive concrete ``clip_range``.
    """
    check_same_shape(values=values, returns=returns, action_mask=action_mask)
    m = as_mask(action_mask)
    v = as_f32(values)
    ret = jax.lax.stop_gradient(jnp.where(m, as_f32(returns), 0.0))
    v_safe = jnp.where(m, v, 0.0)
    loss = 0.5 * jnp.square(v_safe - ret)
    clip_frac = jnp.zeros((), jnp.float32)
    if clip_range is not None:
        if old_values is None:
            raise ValueError("clip_range needs old_values")
        if isinstance(clip_range, (int, float)) and not clip_range > 0:
            raise ValueError(f"clip_range must be > 0, got {clip_range}")
        check_same_shape(values=values, old_values=old_values)
        old = jax.lax.stop_gradient(jnp.where(m, as_f32(old_values), 0.0))
        v_clip = old + jnp.clip(v_safe - old, -clip_range, clip_range)
        loss_clip = 0.5 * jnp.square(v_clip - ret)
        clip_frac = masked_mean(loss_clip > loss, m)
        loss = jnp.maximum(loss, loss_clip)
    diag = {"value_clip_fraction": clip_frac, "value_mean": masked_mean(v_safe, m),
            "return_mean": masked_mean(ret, m)}
    return jnp.where(m, loss, 0.0), diag


def kl_penalty(logprobs, ref_logprobs, action_mask=None, *, kind: str = "k3") -> Array:
    """Per-token estimators of KL(pi_theta || pi_ref) from sampled tokens.

    With ``d = logpi_theta - logpi_ref`` (Schulman, "Approximating KL"):

    * ``k1 = d`` (unbiased, high variance, can be negative);
    * ``k2 = d^2 / 2``;
    * ``k3 = exp(-d) - 1 + d`` (unbiased, >= 0, low variance);
    * ``k3_st``: value of ``k3``, gradient of ``k1`` (straight-through:
      ``k1 + sg(k3 - k1)``).

    Args:
      logprobs: f32/bf16[B, T] learner log-probs (differentiated).
      ref_logprobs: f32/bf16[B, T] reference log-probs (no gradient).
      action_mask: optional bool[B, T]; positions off the mask give 0.
      kind: one of ``k1, k2, k3, k3_st``.

    Returns:
      f32[B, T] per-token KL estimate.

    Raises:
      ValueError: on shape mismatch or unknown ``kind``.
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; valid: {KL_ESTIMATORS}")
    check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    mask = jnp.ones(jnp.shape(logprobs), bool) if action_mask is None else as_mask(action_mask)
    check_same_shape(logprobs=logprobs, action_mask=mask)
    d = jnp.where(mask, as_f32(logprobs) - jax.lax.stop_gradient(as_f32(ref_logprobs)), 0.0)
    if kind == "k1":
        kl = d
    elif kind == "k2":
        kl = 0.5 * d * d
    else:
        k3 = jnp.expm1(-d) + d
        kl = k3 if kind == "k3" else d + jax.lax.stop_gradient(k3 - d)
    return jnp.where(mask, kl, 0.0)


def entropy_from_logits(logits, action_mask=None, *, temperature: float = 1.0,
                        chunk_size: int | None = None) -> Array:
    """Per-token entropy of ``softmax(logits / temperature)`` in float32.

    Args:
      logits: f32/bf16[B, T, V].
      action_mask: optional bool[B, T]; positions off the mask give 0.
      temperature: positive sampling temperature.
      chunk_size: if set, processes ``chunk_size`` time steps at a time
        (``lax.map``) so only a ``[B, chunk, V]`` f32 copy is live; T must be
        a multiple of it.

    Returns:
      f32[B, T] entropies in nats.

    Raises:
      ValueError: on bad shapes, ``temperature <= 0`` or a chunk size that does
        not divide T.
    """
    if jnp.ndim(logits) != 3:
        raise ValueError(f"logits must be [B, T, V], got shape {jnp.shape(logits)}")
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    batch, length, vocab = jnp.shape(logits)

    def entropy(chunk):
        z = chunk.astype(jnp.float32) / temperature
        logp = jax.nn.log_softmax(z, axis=-1)
        p = jnp.exp(logp)
        # Select (not multiply) so -inf logits give 0, not NaN, in value and grad.
        return -jnp.sum(p * jnp.where(p > 0, logp, 0.0), axis=-1)

    if chunk_size is None:
        ent = entropy(logits)
    else:
        if chunk_size < 1 or length % chunk_size:
            raise ValueError(f"chunk_size {chunk_size} must divide T={length}")
        chunks = jnp.moveaxis(logits.reshape(batch, length // chunk_size, chunk_size, vocab), 1, 0)
        ent = jnp.moveaxis(jax.lax.map(entropy, chunks), 0, 1).reshape(batch, length)
    if action_mask is None:
        return ent
    check_same_shape(entropy=ent, action_mask=action_mask)
    return jnp.where(as_mask(action_mask), ent, 0.0)
