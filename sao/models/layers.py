"""Small building blocks: projection, embedding, RMSNorm, RoPE.

Numerics follow the HF Llama/Qwen3 code: RMSNorm normalises in float32 and
multiplies the weight after casting back to the compute dtype; RoPE uses the
``rotate_half`` (non-interleaved) convention with ``inv_freq`` in float32.

With a compute dtype other than float32, `Dense` is a `mixed_einsum`
(bf16 operands, float32 accumulation, float32 kernel gradients; mixed.py);
with float32 it is a plain ``jnp.einsum``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from sao.models.mixed import einsum_parts, mixed_einsum
from sao.models.sharding import param_init

INIT_STD = 0.02  # HF initializer_range


class Dense(nnx.Module):
    """``y = einsum(spec, x, kernel) (+ bias)`` with a logical-named kernel.

    Attributes:
      kernel: ``shape`` in ``param_dtype``, logical axes ``names``.
      bias: optional, shape = output feature dims (``bias_shape``).
    """

    def __init__(self, spec: str, shape: tuple[int, ...], names: tuple[str | None, ...], *,
                 dtype, param_dtype, rngs: nnx.Rngs, bias_shape: tuple[int, ...] | None = None,
                 bias_names: tuple[str | None, ...] | None = None, zero_init: bool = False):
        self.spec = spec
        self.dtype = dtype
        init = nnx.initializers.zeros if zero_init else nnx.initializers.normal(INIT_STD)
        self.kernel = nnx.Param(param_init(init, names)(rngs.params(), shape, param_dtype))
        if bias_shape is not None:
            self.bias = nnx.Param(param_init(nnx.initializers.zeros, bias_names)(
                rngs.params(), bias_shape, param_dtype))
        else:
            self.bias = None

    def __call__(self, x: jax.Array) -> jax.Array:
        if jnp.dtype(self.dtype) != jnp.float32 and einsum_parts(self.spec) is not None:
            y = mixed_einsum(self.spec, x.astype(self.dtype), self.kernel[...])
        else:
            y = jnp.einsum(self.spec, x.astype(self.dtype), self.kernel[...].astype(self.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


class Embed(nnx.Module):
    """Token embedding. ``embedding: [V, D]`` (vocab, embed)."""

    def __init__(self, vocab_size: int, dim: int, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.dtype = dtype
        self.embedding = nnx.Param(param_init(nnx.initializers.normal(INIT_STD), ("vocab", "embed"))(
            rngs.params(), (vocab_size, dim), param_dtype))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """tokens: i32[B, T] -> [B, T, D] in the compute dtype."""
        return jnp.take(self.embedding[...], tokens, axis=0).astype(self.dtype)


class RMSNorm(nnx.Module):
    """``scale * x / sqrt(mean(x^2) + eps)`` over the last axis. ``scale: [dim]`` (norm)."""

    def __init__(self, dim: int, eps: float, *, dtype, param_dtype, rngs: nnx.Rngs):
        del rngs
        self.eps = eps
        self.dtype = dtype
        self.scale = nnx.Param(param_init(nnx.initializers.ones, ("norm",))(
            jax.random.key(0), (dim,), param_dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (self.scale[...].astype(self.dtype) * xf.astype(self.dtype)).astype(self.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding, HF ``rotate_half`` convention.

    Args:
      x: [B, T, N, hd] queries or keys.
      positions: i32[B, T] absolute positions.
      theta: RoPE base.
    Returns:
      [B, T, N, hd] in x's dtype (rotation computed in float32).

    The cos/sin tables are [B, T, 1, hd/2], materialised once
    (``optimization_barrier``): fused into their consumers, XLA:CPU would
    evaluate them once per element of x (N times over), forward and backward.
    """
    hd = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
    freqs = positions.astype(jnp.float32)[..., None, None] * inv_freq  # [B, T, 1, hd/2]
    cos, sin = jax.lax.optimization_barrier((jnp.cos(freqs), jnp.sin(freqs)))
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)
