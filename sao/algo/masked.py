"""Masked statistics over ``[B, T]`` arrays: means, variances, whitening, metrics.

Every statistic is taken over the positions where ``mask`` is true only, and
masked positions are *selected away* with ``jnp.where`` (never multiplied by
0), so a NaN or Inf sitting at a padding / observation position cannot leak
into a result. All arithmetic is float32 whatever the input dtype.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def as_f32(x) -> Array:
    """Returns ``x`` as a float32 array (bf16 / f16 / int inputs are upcast)."""
    return jnp.asarray(x).astype(jnp.float32)


def as_mask(mask) -> Array:
    """Returns ``mask`` as a bool array (any nonzero entry counts as true)."""
    mask = jnp.asarray(mask)
    return mask if mask.dtype == jnp.bool_ else mask != 0


def check_same_shape(**arrays) -> None:
    """Raises ValueError unless all given arrays have the same shape."""
    shapes = {name: tuple(jnp.shape(a)) for name, a in arrays.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shape mismatch: {shapes}")


def masked_sum(x, mask, axis=None) -> Array:
    """Sum of ``x`` over ``mask``: ``x: [..]`` any float, ``mask`` same shape.

    Returns f32, reduced over ``axis`` (None: all axes).
    """
    check_same_shape(x=x, mask=mask)
    return jnp.sum(jnp.where(as_mask(mask), as_f32(x), 0.0), axis=axis)


def masked_count(mask, axis=None) -> Array:
    """Number of true entries of ``mask`` as f32, reduced over ``axis``."""
    return jnp.sum(as_mask(mask), axis=axis).astype(jnp.float32)


def masked_mean(x, mask, axis=None) -> Array:
    """Mean of ``x`` over the true entries of ``mask``.

    Args:
        x: f32/bf16[...] values.
        mask: bool/int[...] same shape as ``x``.
        axis: axis or axes to reduce (None: all).

    Returns:
        f32 mean; 0 where the mask selects nothing (never NaN).

    Raises:
        ValueError: if shapes differ.
    """
    count = masked_count(mask, axis)
    return masked_sum(x, mask, axis) / jnp.maximum(count, 1.0)


def masked_var(x, mask, axis=None, *, unbiased: bool = False) -> Array:
    """Variance of ``x`` over ``mask`` (population by default).

    Two-pass (mean first) for accuracy. ``unbiased=True`` divides by
    ``count - 1``. Returns f32; 0 where fewer than 1 (2 if unbiased) entries
    are selected. Raises ValueError if shapes differ.
    """
    x = as_f32(x)
    mask = as_mask(mask)
    mean = masked_mean(x, mask, axis)
    mean_b = mean if axis is None else jnp.expand_dims(mean, axis)
    centred = jnp.where(mask, x - mean_b, 0.0)
    count = masked_count(mask, axis)
    denom = count - 1.0 if unbiased else count
    return jnp.sum(centred * centred, axis=axis) / jnp.maximum(denom, 1.0)


def masked_whiten(x, mask, *, shift_mean: bool = True, eps: float = 1e-8) -> Array:
    """Whitens ``x`` with the mean/std of its masked entries (batch-wide).

    ``(x - mean) / sqrt(var + eps)`` over the whole array, statistics from
    ``mask`` only; ``shift_mean=False`` only rescales (adds the mean back).
    Masked-out positions are 0 in the output. Returns f32, shape of ``x``.
    Raises ValueError if shapes differ.
    """
    x = as_f32(x)
    mask = as_mask(mask)
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = (x - mean) * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return jnp.where(mask, out, 0.0)


def explained_variance(values, returns, mask, *, eps: float = 1e-8) -> Array:
    """Explained variance ``1 - Var(R - V) / Var(R)`` over masked tokens.

    docs/algorithm.md §5 critic metric. ``values, returns: f32[B, T]``,
    ``mask: bool[B, T]`` (action tokens). Returns a f32 scalar: 1 is a perfect
    critic, 0 is no better than a constant, negative is worse. When
    ``Var(R) <= eps`` (constant returns, or no token selected) the metric is
    undefined and 0 is returned instead of NaN. Raises ValueError on shape
    mismatch.
    """
    check_same_shape(values=values, returns=returns, mask=mask)
    values, returns = as_f32(values), as_f32(returns)
    var_r = masked_var(returns, mask)
    var_err = masked_var(returns - values, mask)
    safe = jnp.where(var_r > eps, var_r, 1.0)
    return jnp.where(var_r > eps, 1.0 - var_err / safe, 0.0)
