"""Small building blocks: projection, embedding, RMSNorm, RoPE.

Numerics follow the HF Llama/Qwen3 code: RMSNorm normalises in float32 and
multiplies the weight after casting back to the compute dtype; RoPE uses the
``rotate_half`` (non-interleaved) convention with ``inv_freq`` in float32.

Mixed precision (compute dtype bfloat16): `Dense` multiplies bf16 operands
with float32 accumulation in the forward pass and for the input gradient, and
returns the kernel gradient in float32 (`mixed_einsum`), so float32 master
weights get an unrounded gradient. With a float32 compute dtype `Dense` is a
plain ``jnp.einsum``.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental.layout import Layout, with_layout_constraint

from sao.models.sharding import param_init

INIT_STD = 0.02  # HF initializer_range


def _einsum_parts(spec: str) -> tuple[str, str, str] | None:
    """``"btd,dhk->bthk"`` -> ``("btd", "dhk", "bthk")``; None for specs
    `mixed_einsum` does not take (ellipsis, not two operands, implicit output)."""
    if "..." in spec or "->" not in spec:
        return None
    ins, out = spec.replace(" ", "").split("->")
    ops = ins.split(",")
    return (ops[0], ops[1], out) if len(ops) == 2 else None


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def mixed_einsum(spec: str, x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``einsum(spec, x, kernel)`` with low-precision operands and float32 accumulation.

    Args:
      spec: two-operand einsum with an explicit output, e.g. ``"btd,df->btf"``.
      x: activations in the compute dtype (e.g. bf16).
      kernel: weights, any float dtype; cast to ``x.dtype`` for the product.
    Returns:
      ``x.dtype``, accumulated in float32 and rounded once. Gradients: the
      input gradient is a ``x.dtype`` product accumulated in float32; the
      kernel gradient is accumulated and returned in float32 (then cast to
      ``kernel.dtype``), never rounded to ``x.dtype`` on the way. XLA:CPU runs
      bf16 x bf16 -> f32 products natively (AVX512-BF16) where plain bf16
      einsums are widened to f32 (benchmarks/README.md, learner step).
    """
    return jnp.einsum(spec, x, kernel.astype(x.dtype), preferred_element_type=jnp.float32
                      ).astype(x.dtype)


def _mixed_einsum_fwd(spec, x, kernel):
    return mixed_einsum(spec, x, kernel), (x, kernel)


def transposed_dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a.T @ b`` accumulated in float32: a [N, K], b [N, M] -> f32[K, M].

    The product of two token-major operands over their token dim (a weight
    gradient). XLA:CPU's bf16 matmul (YNNPACK) takes no left operand
    contracted over its major dim, widens such products to f32, and folds a
    plain transpose back into the product (a transpose is only a layout
    change to XLA); so on CPU ``a.T`` is first made row-major in memory with a
    layout constraint, one cheap copy that lets the product run in bf16.
    The result is pinned row-major as well: XLA would otherwise fold a later
    transpose of it (e.g. a tied embedding's gradient) into the product and
    recreate the unsupported form after it chose bf16 (a runtime error).
    Other platforms get the plain product."""
    def cpu(a, b):
        row_major = Layout(major_to_minor=(0, 1))
        at = with_layout_constraint(a.T, row_major)
        return with_layout_constraint(jnp.dot(at, b, preferred_element_type=jnp.float32),
                                      row_major)

    def default(a, b):
        return jnp.einsum("nk,nm->km", a, b, preferred_element_type=jnp.float32)

    return jax.lax.platform_dependent(a, b, cpu=cpu, default=default)


def _kernel_grad(lhs: str, rhs: str, out: str, x: jax.Array, g: jax.Array) -> jax.Array:
    """f32 ``einsum(f"{lhs},{out}->{rhs}", x, g)``, the kernel gradient (a sum
    over the batch/token dims), as a `transposed_dot` when the spec is
    ``batch+contract, contract+features -> batch+features``."""
    nb = len(lhs) + len(out) - len(rhs)
    if nb % 2 or lhs[:nb // 2] != out[:nb // 2] or lhs[nb // 2:] + out[nb // 2:] != rhs:
        return jnp.einsum(f"{lhs},{out}->{rhs}", x, g, preferred_element_type=jnp.float32)
    nb //= 2
    n = math.prod(x.shape[:nb])
    return transposed_dot(x.reshape(n, -1), g.reshape(n, -1)).reshape(
        x.shape[nb:] + g.shape[nb:])


def _mixed_einsum_bwd(spec, res, g):
    x, kernel = res
    lhs, rhs, out = _einsum_parts(spec)
    g = g.astype(x.dtype)
    dx = jnp.einsum(f"{out},{rhs}->{lhs}", g, kernel.astype(x.dtype),
                    preferred_element_type=jnp.float32).astype(x.dtype)
    return dx, _kernel_grad(lhs, rhs, out, x, g).astype(kernel.dtype)


mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)


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
        if jnp.dtype(self.dtype) != jnp.float32 and _einsum_parts(self.spec) is not None:
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
    """
    hd = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, hd/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    xf = x.astype(jnp.float32)
    x1, x2 = jnp.split(xf, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (xf * cos + rotated * sin).astype(x.dtype)
