"""Mixed-precision products: low-precision operands, float32 accumulation.

Under mixed precision (``ModelConfig.dtype="bfloat16"`` with float32
parameters, the way full-scale runs train) every matmul of the decoder takes
bf16 operands and accumulates in float32 (`mixed_einsum`), in the forward
pass and in both backward products; kernel gradients are accumulated and
returned in float32, so float32 master weights get an unrounded gradient.
The log-softmax stays float32 and the LM head returns float32 logits (its
operands follow ``ModelConfig.head_dtype``, float32 by default; logprobs.py).

XLA:CPU specifics (benchmarks/README.md, learner step): its bf16 matmul
(YNNPACK, AVX512-BF16) takes only bf16 x bf16 -> f32 products whose left
operand is contracted over its minor dim; a plain bf16 einsum (bf16 output)
or a product contracting the major dim of both operands (a weight gradient)
is widened to f32 instead. `mixed_einsum` asks for f32 results and
`transposed_dot` lays the weight-gradient operand out transposed in memory.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.layout import Layout, with_layout_constraint


def einsum_parts(spec: str) -> tuple[str, str, str] | None:
    """``"btd,dhk->bthk"`` -> ``("btd", "dhk", "bthk")``; None for specs
    `mixed_einsum` does not take (ellipsis, not two operands, implicit output)."""
    if "..." in spec or "->" not in spec:
        return None
    ins, out = spec.replace(" ", "").split("->")
    ops = ins.split(",")
    return (ops[0], ops[1], out) if len(ops) == 2 else None


def _row_major(x: jax.Array) -> jax.Array:
    """``x`` constrained to be row-major in memory (a layout constraint: XLA
    inserts a copy where ``x`` would otherwise be laid out differently)."""
    return with_layout_constraint(x, Layout(major_to_minor=tuple(range(x.ndim))))


def transposed_dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a.T @ b`` accumulated in float32: a [N, K], b [N, M] -> f32[K, M].

    The product of two token-major operands over their token dim (a weight
    gradient). XLA:CPU's bf16 matmul takes no left operand contracted over
    its major dim and widens such products to f32; it also folds a plain
    transpose back into the product (to XLA a transpose is a layout change).
    So on CPU ``a.T`` is first made row-major in memory with a layout
    constraint (one copy of the smaller operand), and the result is pinned
    row-major too: XLA would otherwise fold a later transpose of it (e.g. a
    tied embedding's gradient) into the product and recreate the unsupported
    form after having chosen bf16 (a runtime error). Other platforms get the
    plain product."""
    def cpu(a, b):
        return _row_major(jnp.dot(_row_major(a.T), b, preferred_element_type=jnp.float32))

    def default(a, b):
        return jnp.einsum("nk,nm->km", a, b, preferred_element_type=jnp.float32)

    return jax.lax.platform_dependent(a, b, cpu=cpu, default=default)


def product_as_written(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    """f32 ``einsum(spec, x, y)`` whose result keeps the layout ``spec`` names.

    XLA folds a transpose of a product's result back into the product (it
    swaps the operands), which can undo a deliberate choice of which operand
    gets a transposed copy. On CPU the result is pinned row-major with a
    layout constraint; other platforms get the plain product."""
    def cpu(x, y):
        return _row_major(jnp.einsum(spec, x, y, preferred_element_type=jnp.float32))

    def default(x, y):
        return jnp.einsum(spec, x, y, preferred_element_type=jnp.float32)

    return jax.lax.platform_dependent(x, y, cpu=cpu, default=default)


def _rhs_grad(lhs: str, rhs: str, out: str, x: jax.Array, g: jax.Array) -> jax.Array:
    """f32 ``einsum(f"{lhs},{out}->{rhs}", x, g)``, the right operand's
    gradient, as a `transposed_dot` when the spec is ``batch+contract,
    contract+features -> batch+features`` (a projection's kernel gradient)."""
    nb = len(lhs) + len(out) - len(rhs)
    if nb % 2 or lhs[:nb // 2] != out[:nb // 2] or lhs[nb // 2:] + out[nb // 2:] != rhs:
        return jnp.einsum(f"{lhs},{out}->{rhs}", x, g, preferred_element_type=jnp.float32)
    nb //= 2
    n = math.prod(x.shape[:nb])
    return transposed_dot(x.reshape(n, -1), g.reshape(n, -1)).reshape(
        x.shape[nb:] + g.shape[nb:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def mixed_einsum(spec: str, x: jax.Array, y: jax.Array, out_dtype=None) -> jax.Array:
    """``einsum(spec, x, y)`` with ``x.dtype`` operands and float32 accumulation.

    Args:
      spec: two-operand einsum with an explicit output, e.g. ``"btd,df->btf"``.
      x: left operand in the compute dtype (e.g. bf16 activations).
      y: right operand (weights or activations), any float dtype; cast to
        ``x.dtype`` for the product.
      out_dtype: result dtype; default ``x.dtype`` (rounded once at the end).
    Returns:
      the product in ``out_dtype``. Gradients: each is a ``x.dtype`` x
      ``x.dtype`` product accumulated in float32 (the incoming cotangent is
      rounded to ``x.dtype`` first); ``x``'s is returned in ``x.dtype``,
      ``y``'s in ``y.dtype``, never rounded to ``x.dtype`` on the way (a
      float32 master weight gets a float32 gradient).
    """
    out = jnp.einsum(spec, x, y.astype(x.dtype), preferred_element_type=jnp.float32)
    return out.astype(out_dtype or x.dtype)


def _mixed_einsum_fwd(spec, x, y, out_dtype):
    y_cd = y.astype(x.dtype)  # cast once, reused by the backward pass
    out = jnp.einsum(spec, x, y_cd, preferred_element_type=jnp.float32)
    return out.astype(out_dtype or x.dtype), (x, y_cd, jnp.zeros((0,), y.dtype))


def _mixed_einsum_bwd(spec, out_dtype, res, g):
    del out_dtype
    x, y_cd, y_dtype = res
    lhs, rhs, out = einsum_parts(spec)
    g = g.astype(x.dtype)
    dx = jnp.einsum(f"{out},{rhs}->{lhs}", g, y_cd, preferred_element_type=jnp.float32)
    return dx.astype(x.dtype), _rhs_grad(lhs, rhs, out, x, g).astype(y_dtype.dtype)


mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)
