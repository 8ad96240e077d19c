"""One aggregator from per-token values to a scalar loss (docs/algorithm.md §4 "N").

Modes (``x: f32[B, T]`` per-token values, ``m: bool[B, T]`` mask, ``n_b`` the
mask count of row b, ``B'`` the number of rows with ``n_b > 0``):

* ``token-mean``: ``sum_{b,t} m x / N`` with ``N = sum m`` or, when
  ``global_token_count`` is given, that count (the number of action tokens in
  the *global* batch, across micro-batches and data-parallel shards), so that
  summing the micro-batch results equals the whole-batch token mean;
* ``seq-mean-token-mean``: ``(1/B') sum_b (1/n_b) sum_t m x``;
* ``seq-mean-token-sum``: ``(1/B') sum_b sum_t m x``;
* ``seq-mean-token-sum-norm``: ``sum_{b,t} m x / (B' * L)`` with a constant
  normaliser ``L`` (Dr.GRPO), ``normalizer`` if given else the padded length T.

For the seq modes ``global_seq_count`` plays the role of ``B'`` across
micro-batches. Masked positions are selected away (``jnp.where``), so NaN/Inf
there never reach the result; an empty mask gives 0.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from sao.algo.checks import check_range
from sao.algo.masked import as_f32, as_mask, check_same_shape

Array = jax.Array
AGGREGATION_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                     "seq-mean-token-sum-norm")


def aggregate(per_token, mask, mode: str = "token-mean", *, global_token_count=None,
              global_seq_count=None, normalizer: float | None = None) -> Array:
    """Reduces per-token values to a scalar.

    Args:
      per_token: f32/bf16[B, T] per-token losses.
      mask: bool/int[B, T] (usually ``action_mask``).
      mode: one of :data:`AGGREGATION_MODES` (see module doc).
      global_token_count: ``token-mean`` denominator across micro-batches /
        shards (scalar); default: this array's mask count.
      global_seq_count: seq-mode row count across micro-batches (scalar);
        default: rows of this array with at least one masked token.
      normalizer: constant ``L`` of ``seq-mean-token-sum-norm`` (default T).

    Returns:
      f32 scalar; 0 when the mask is empty.

    Raises:
      ValueError: on shape mismatch, a non-2-D input, an unknown mode, a
        concrete negative ``global_token_count`` / ``global_seq_count`` or a
        concrete ``normalizer <= 0``.
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid: {AGGREGATION_MODES}")
    check_same_shape(per_token=per_token, mask=mask)
    if jnp.ndim(per_token) != 2:
        raise ValueError(f"expected [B, T], got shape {jnp.shape(per_token)}")
    if global_token_count is not None:
        check_range("global_token_count", global_token_count, low=0.0)
    if global_seq_count is not None:
        check_range("global_seq_count", global_seq_count, low=0.0)
    if normalizer is not None:
        check_range("normalizer", normalizer, low=0.0, low_inclusive=False)
    m = as_mask(mask)
    x = jnp.where(m, as_f32(per_token), 0.0)
    if mode == "token-mean":
        count = jnp.sum(m) if global_token_count is None else global_token_count
        return jnp.sum(x) / jnp.maximum(as_f32(count), 1.0)
    n_row = jnp.sum(m, axis=1).astype(jnp.float32)
    if global_seq_count is None:
        n_seq = jnp.sum(n_row > 0).astype(jnp.float32)
    else:
        n_seq = as_f32(global_seq_count)
    n_seq = jnp.maximum(n_seq, 1.0)
    row_sum = jnp.sum(x, axis=1)
    if mode == "seq-mean-token-mean":
        return jnp.sum(row_sum / jnp.maximum(n_row, 1.0)) / n_seq
    if mode == "seq-mean-token-sum":
        return jnp.sum(row_sum) / n_seq
    length = x.shape[1] if normalizer is None else normalizer
    return jnp.sum(row_sum) / (n_seq * length)
