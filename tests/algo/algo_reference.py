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


def group_advantages_loop(rewards, group_ids, mode, eps=1e-6):
    """GRPO ("std"), Dr.GRPO ("none") and RLOO ("rloo") one element at a time."""
    out = np.zeros(len(rewards))
    for i, (r, g) in enumerate(zip(rewards, group_ids)):
        members = [float(rewards[j]) for j in range(len(rewards)) if group_ids[j] == g]
        size = len(members)
        mean = sum(members) / size
        std = (sum((x - mean) ** 2 for x in members) / size) ** 0.5
        if size == 1 or std < eps:
            continue
        if mode == "std":
            out[i] = (r - mean) / (std + eps)
        elif mode == "none":
            out[i] = r - mean
        else:
            out[i] = r - (sum(members) - r) / (size - 1)
    return out


def running_mean_loop(batches, slots_per_batch, window, default=0.0):
    """Per-slot running-mean baseline over successive batches, with Python lists."""
    history: dict[int, list[float]] = {}
    outs = []
    for rewards, slots in zip(batches, slots_per_batch):
        adv = []
        for r, s in zip(rewards, slots):
            past = history.get(int(s), [])[-window:]
            adv.append(r - (sum(past) / len(past) if past else default))
        for r, s in zip(rewards, slots):
            history.setdefault(int(s), []).append(float(r))
        outs.append(np.asarray(adv))
    return outs


def dis_loop(logprobs, rollout_logprobs, advantages, mask, eps_low, eps_high):
    """Per-token DIS loss and its gradient w.r.t. logprobs."""
    loss = np.zeros(logprobs.shape)
    grad = np.zeros(logprobs.shape)
    for idx in np.ndindex(*logprobs.shape):
        if not mask[idx]:
            continue
        ratio = np.exp(float(logprobs[idx]) - float(rollout_logprobs[idx]))
        weight = ratio if 1 - eps_low < ratio < 1 + eps_high else 0.0
        loss[idx] = -weight * advantages[idx] * logprobs[idx]
        grad[idx] = -weight * advantages[idx]
    return loss, grad


def ppo_loop(logprobs, old_logprobs, advantages, mask, eps_low, eps_high, clip_c=None):
    """Per-token PPO clip (clip-higher, optional dual clip)."""
    loss = np.zeros(logprobs.shape)
    for idx in np.ndindex(*logprobs.shape):
        if not mask[idx]:
            continue
        ratio = np.exp(float(logprobs[idx]) - float(old_logprobs[idx]))
        a = float(advantages[idx])
        value = max(-a * ratio, -a * min(max(ratio, 1 - eps_low), 1 + eps_high))
        if clip_c is not None and a < 0:
            value = min(value, -a * clip_c)
        loss[idx] = value
    return loss


def gspo_loop(logprobs, old_logprobs, advantages, mask, eps_low, eps_high):
    """Per-token GSPO loss values: sequence ratio = geometric mean of token ratios."""
    loss = np.zeros(logprobs.shape)
    for b in range(logprobs.shape[0]):
        idx = [t for t in range(logprobs.shape[1]) if mask[b, t]]
        if not idx:
            continue
        s = np.exp(sum(float(logprobs[b, t]) - float(old_logprobs[b, t]) for t in idx) / len(idx))
        for t in idx:
            a = float(advantages[b, t])
            loss[b, t] = max(-a * s, -a * min(max(s, 1 - eps_low), 1 + eps_high))
    return loss


def tis_loop(logprobs, old_logprobs, rollout_logprobs, advantages, mask, eps_low, eps_high,
             cap, mode):
    """PPO loss times the truncated (TIS) or masked (MIS) rollout importance weight."""
    ppo = ppo_loop(logprobs, old_logprobs, advantages, mask, eps_low, eps_high)
    loss = np.zeros(logprobs.shape)
    for idx in np.ndindex(*logprobs.shape):
        if mask[idx]:
            w = np.exp(float(old_logprobs[idx]) - float(rollout_logprobs[idx]))
            weight = min(w, cap) if mode == "truncate" else (w if w <= cap else 0.0)
            loss[idx] = weight * ppo[idx]
    return loss


def band_counts_by_lag_loop(log_ratio, lags, mask, eps_low, eps_high, num_bins):
    """Token-by-token counts of all / below-band / above-band action tokens per lag bin."""
    out = {k: np.zeros(num_bins) for k in ("tokens", "low", "high")}
    for b in range(log_ratio.shape[0]):
        for t in range(log_ratio.shape[1]):
            if not mask[b, t]:
                continue
            k = min(max(int(lags[b, t]), 0), num_bins - 1)
            r = float(np.exp(np.float64(log_ratio[b, t])))
            out["tokens"][k] += 1
            out["low"][k] += r <= 1.0 - eps_low
            out["high"][k] += r >= 1.0 + eps_high
    return out
