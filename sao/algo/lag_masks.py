"""Where the importance-ratio band bites: token counts per policy lag and side.

SAO's DIS masks a token whose ratio ``r = exp(logpi_theta - logpi_rollout)``
leaves the open band ``(1 - eps_low, 1 + eps_high)`` (:func:`sao.algo.dis_policy_loss`).
A mask rate pooled over the batch cannot say whether the masks come from
policy lag (``r`` drifts as the learner moves on) or from a train/inference
mismatch (``r != 1`` already at lag 0, e.g. a bf16 engine beside an f32
learner). :func:`band_counts_by_lag` splits the counts by lag and side; the
caller sums them over micro-batches and steps and divides (rates per lag).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from sao.algo.checks import check_range
from sao.algo.masked import as_f32, as_mask, check_same_shape

Array = jax.Array


def band_counts_by_lag(log_ratio, lags, action_mask, *, eps_low: float, eps_high: float,
                       num_bins: int) -> dict[str, Array]:
    """Action-token counts per lag bin: all, below the band, above the band.

    Args:
      log_ratio: f32/bf16[B, T] ``logpi_theta - logpi_rollout`` (no gradient needed).
      lags: int[B, T] learner version minus the version that sampled the token
        (>= 0 on action tokens; negative values count in bin 0).
      action_mask: bool[B, T] tokens to count.
      eps_low, eps_high: band half-widths (> 0; ``eps_low <= 1``), as in DIS.
      num_bins: static number of bins L >= 1; bin ``k < L - 1`` holds lag k,
        the last bin every lag ``>= L - 1``.

    Returns:
      ``{"tokens", "low", "high"}`` each f32[L]: action tokens per bin, and those
      with ``r <= 1 - eps_low`` / ``r >= 1 + eps_high`` (DIS's masked sides).

    Raises:
      ValueError: on shape mismatch, ``num_bins < 1`` or concrete eps out of range.
    """
    check_same_shape(log_ratio=log_ratio, lags=lags, action_mask=action_mask)
    check_range("eps_low", eps_low, low=0.0, high=1.0, low_inclusive=False)
    check_range("eps_high", eps_high, low=0.0, low_inclusive=False)
    if int(num_bins) < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    m = as_mask(action_mask)
    ratio = jnp.exp(jnp.where(m, as_f32(log_ratio), 0.0))
    low = m & (ratio <= 1.0 - eps_low)
    high = m & (ratio >= 1.0 + eps_high)
    bins = jnp.clip(jnp.asarray(lags).astype(jnp.int32), 0, int(num_bins) - 1)
    onehot = jax.nn.one_hot(bins, int(num_bins), dtype=jnp.float32)      # [B, T, L]

    def count(sel):
        return jnp.einsum("btl,bt->l", onehot, sel.astype(jnp.float32))
    return {"tokens": count(m), "low": count(low), "high": count(high)}


def rates_by_lag(counts, prefix: str) -> dict[str, float]:
    """Host side: ``{prefix}masked_low/lag{k}``, ``.../masked_high/lag{k}`` (fractions of
    that lag's action tokens) and ``{prefix}tokens/lag{k}`` for every bin holding
    tokens; the last bin is named ``lag{k}+``. ``counts``: the arrays of
    :func:`band_counts_by_lag` (numpy or jax), summed as the caller likes."""
    tokens = [float(x) for x in counts["tokens"]]
    out: dict[str, float] = {}
    for k, n in enumerate(tokens):
        if n <= 0:
            continue
        name = f"lag{k}" + ("+" if k == len(tokens) - 1 and len(tokens) > 1 else "")
        out[f"{prefix}tokens/{name}"] = n
        out[f"{prefix}masked_low/{name}"] = float(counts["low"][k]) / n
        out[f"{prefix}masked_high/{name}"] = float(counts["high"][k]) / n
    return out
