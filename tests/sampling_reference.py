"""Slow, obviously-right NumPy reference of the sampler's truncated distribution."""
from __future__ import annotations

import numpy as np


def truncated_logprobs(logits, temperature: float, top_p: float, top_k: int) -> np.ndarray:
    """``log p`` f64[V] of the distribution ``sample_tokens`` draws from for one row:
    softmax of ``logits / temperature`` over the kept tokens, ``-inf`` elsewhere.

    Kept: the ``top_k`` largest scaled logits (all of them when ``top_k <= 0``; ties
    with the k-th are kept), then among those, going down the sorted list, every
    token whose renormalised mass strictly above it is ``< top_p`` (all when
    ``top_p >= 1``; ties with the last kept value are kept)."""
    z = np.asarray(logits, np.float64) / temperature
    keep = np.ones(z.shape, bool)
    if top_k > 0:
        kth = sorted(z, reverse=True)[min(top_k, z.size) - 1]
        keep &= z >= kth
    if top_p < 1.0:
        order = sorted(np.flatnonzero(keep), key=lambda i: -z[i])
        p = np.exp(z[order] - z[order].max())
        p /= p.sum()
        above = 0.0
        kept_min = None
        for i, pi in zip(order, p):
            if above < top_p:
                kept_min = z[i]
            above += pi
        keep &= z >= kept_min
    out = np.full(z.shape, -np.inf)
    zk = z[keep]
    out[keep] = zk - (zk.max() + np.log(np.exp(zk - zk.max()).sum()))
    return out
