"""Slow, obviously-right NumPy loop references for the sao.algo kernels."""
from __future__ import annotations

import numpy as np


def gae_loop(rewards, values, mask, gamma, lam, bootstrap=None):
    """Skip-observation GAE by compacting action tokens and running classic GAE."""
    rewards = np.asarray(rewards, np.float64)
    values = np.asarray(values, np.float64)
    mask = np.asarray(mask, bool)
    batch, length = rewards.shape
    lam = np.broadcast_to(np.asarray(lam, np.float64), (batch,))
    adv = np.zeros((batch, length))
    ret = np.zeros((batch, length))
    for b in range(batch):
        idx = [t for t in range(length) if mask[b, t]]
        if not idx:
            continue
        # Move each reward onto the closest action token at or before it.
        r = {t: 0.0 for t in idx}
        last = None
        for t in range(length):
            if mask[b, t]:
                last = t
            if last is not None:
                r[last] += rewards[b, t]
        next_v = 0.0 if bootstrap is None else float(bootstrap[b])
        next_a = 0.0
        for t in reversed(idx):
            delta = r[t] + gamma * next_v - values[b, t]
            next_a = delta + gamma * lam[b] * next_a
            next_v = values[b, t]
            adv[b, t] = next_a
            ret[b, t] = next_a + values[b, t]
    return adv, ret


def classic_gae_loop(rewards, values, gamma, lam, bootstrap=0.0):
    """Textbook GAE for one row of dense steps."""
    length = len(rewards)
    adv = np.zeros(length)
    next_a, next_v = 0.0, bootstrap
    for t in reversed(range(length)):
        delta = rewards[t] + gamma * next_v - values[t]
        next_a = delta + gamma * lam * next_a
        next_v = values[t]
        adv[t] = next_a
    return adv
