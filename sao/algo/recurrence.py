"""Solvers of the reverse affine recurrence ``x_t = a_t * x_{t+1} + b_t`` over time.

Rows of ``[B, T]`` coefficients are independent; time runs along axis 1 and the
value after the last position, ``x_T``, is given (``x_end: f32[B, 1]``). Every
solver returns the *next* value ``x_{t+1}`` for each t in [0, T): that is what
skip-observation GAE and reward relocation read (sao/algo/skip_gae.py).

* :func:`solve_blocked` (the default of ``gae``, fastest on CPU): blocks of
  ``block`` consecutive tokens, composed in parallel, a sequential loop over
  the block boundaries, then every in-block value recomputed from the value
  after its block. The coefficients are handed over as a *function of the
  in-block offset* (``coeff(j) -> (a[:, :, j], b[:, :, j])``) so the caller
  derives them from its raw inputs slice by slice; see the function's notes.
* :func:`solve_associative`: ``jax.lax.associative_scan`` over the affine maps
  (O(log T) depth).

(The token-by-token reference, ``gae(method="scan")``, is the GAE recursion
itself, not this affine form: sao/algo/skip_gae.py.)
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array
BLOCK = 8  # tokens per block of solve_blocked
GROUP = 8  # blocks per iteration of its loop over block boundaries
Coefficients = Callable[[int], tuple[Array, Array]]


def to_blocks(x: Array, fill, block: int = BLOCK) -> Array:
    """``[B, T]`` -> ``[B, n, block]``, n = ceil(T / block), padding T with ``fill``.

    Padding positions must be identity maps of the recurrence (a=1, b=0) in
    the caller's coefficients, so they leave ``x_end`` unchanged. Lengths
    that are a multiple of ``block`` need no padding (no copy).
    """
    pad = -x.shape[1] % block
    if pad:
        x = jnp.pad(x, ((0, 0), (0, pad)), constant_values=fill)
    return x.reshape(x.shape[0], -1, block)


def from_blocks(x: Array, length: int) -> Array:
    """``[B, n, block]`` -> ``[B, length]`` (drops the padding of :func:`to_blocks`)."""
    x = x.reshape(x.shape[0], -1)
    return x if x.shape[1] == length else x[:, :length]


def typed_like(x: Array, data: Array) -> Array:
    """``x``, typed like ``data`` (same shape): inside ``shard_map`` a loop
    carry that starts from a constant (a default bootstrap of zeros) is not
    "varying" across devices while the loop's output is, and the loop is
    rejected; selecting against ``data`` gives it data's type. XLA folds the
    select away."""
    return jnp.where(True, x, data)


def _carry_over_blocks(block_a: Array, block_b: Array, x_end: Array, group: int) -> Array:
    """x after each block, ``after[:, i] = x_{start of block i+1}``: f32[B, n].

    A reverse ``fori_loop`` (static bounds: it lowers to a scan, so reverse-mode
    differentiation works) over groups of ``group`` blocks: each iteration
    slices a [B, group] tile of the block maps and writes the ``group`` carried
    values back in place, so the loop runs ceil(n/group) times and nothing is
    transposed. The maps are padded with identities to whole groups.
    """
    batch, num_blocks = block_a.shape
    pad = -num_blocks % group
    maps = jnp.stack([block_a, block_b])  # one dynamic slice per iteration, not two
    if pad:
        maps = jnp.concatenate([maps, jnp.stack([jnp.ones((batch, pad), maps.dtype),
                                                 jnp.zeros((batch, pad), maps.dtype)])], axis=2)
    steps = (num_blocks + pad) // group

    def body(i, carry):
        x, after = carry
        start = (steps - 1 - i) * group
        zero = jnp.zeros_like(start)  # index dtypes must agree (int64 under x64)
        tile = jax.lax.dynamic_slice(maps, (zero, zero, start), (2, batch, group))
        out = [None] * group
        for k in range(group - 1, -1, -1):
            out[k] = x
            x = tile[0, :, k] * x + tile[1, :, k]
        return x, jax.lax.dynamic_update_slice(after, jnp.stack(out, axis=1), (zero, start))

    x0 = typed_like(x_end[:, 0], maps[1, :, 0])
    after = jax.lax.fori_loop(0, steps, body, (x0, jnp.zeros_like(maps[0])))[1]
    return after if not pad else after[:, :num_blocks]


def solve_blocked(coeff: Coefficients, x_end: Array, block: int = BLOCK,
                  group: int = GROUP) -> Array:
    """Blocked solver: parallel within blocks, sequential across block boundaries.

    Args:
      coeff: ``coeff(j) -> (a_j, b_j)``, both f32[B, n]: the coefficients at
        offset ``j`` in [0, block) of each of the n blocks (``a[:, :, j]`` of
        the ``[B, n, block]`` layout of :func:`to_blocks`), any n >= 1.
      x_end: f32[B, 1], the value after the last position.

    Returns:
      ``x_next``: f32[B, n, block], ``x_{t+1}`` at every position.

    Three stages on XLA:CPU: (1) each block's composed map ``x_start =
    A x_after + B`` (``block`` unrolled steps over strided slices, one pass
    over the inputs); (2) :func:`_carry_over_blocks`; (3) one elementwise pass
    in the ``[B, n, block]`` layout: position k of a block applies the maps
    at offsets ``block-1 .. k+1`` to the value after the block, as a chain of
    selects on the offset. Stage 3 writes whole contiguous blocks, which XLA
    vectorises one block per SIMD register; an interleaving ``stack`` along the
    last axis (an earlier layout) compiled to a branchy scalar concatenate.
    ``coeff`` is called afresh in stages 1 and 3 so that XLA fuses the slices
    of the caller's raw inputs into each stage: coefficient arrays computed
    for the whole ``[B, T]`` first and sliced afterwards ran 3-4x slower.
    """
    block_a, block_b = coeff(block - 1)
    for j in range(block - 2, -1, -1):
        a_j, b_j = coeff(j)
        block_b = a_j * block_b + b_j
        block_a = a_j * block_a
    after = _carry_over_blocks(block_a, block_b, x_end, group)
    offset = jax.lax.broadcasted_iota(jnp.int32, (1, 1, block), 2)
    x = jnp.broadcast_to(after[:, :, None], after.shape + (block,))
    for j in range(block - 1, 0, -1):
        a_j, b_j = coeff(j)
        x = jnp.where(offset < j, a_j[:, :, None] * x + b_j[:, :, None], x)
    return x


def _affine_combine(later, earlier):
    """Composes affine maps for a reverse associative scan.

    ``later = (a1, b1)`` is the map accumulated over higher t, ``earlier``
    the map at the current t: result is ``x -> a2 * (a1 * x + b1) + b2``.
    """
    a1, b1 = later
    a2, b2 = earlier
    return a1 * a2, a2 * b1 + b2


def solve_associative(a: Array, b: Array, x_end: Array) -> Array:
    """``x_{t+1}`` for f32[B, T] coefficients by ``jax.lax.associative_scan``."""
    b = jnp.concatenate([b[:, :-1], b[:, -1:] + a[:, -1:] * x_end], axis=1)
    x = jax.lax.associative_scan(_affine_combine, (a, b), reverse=True, axis=1)[1]
    return jnp.concatenate([x[:, 1:], x_end], axis=1)
