"""Critics scored on one fixed held-out set of episodes, not on their own batches.

A critic's explained variance on its own training batches depends on what its
policy sampled (easier batches, easier targets), so K = 1 vs K = 2 or frozen
vs full critics cannot be compared that way. Here every critic is scored on
the same episodes: sampled once from held-out prompts by the starting policy
(the SFT warm start, shared by all arms of a seed) and kept in a file, so arms
that point ``eval.value_episodes_file`` at one path share them. The targets are
the episodes' Monte-Carlo returns (``gamma`` discount per action token, the
reward on the last action token).

Metrics (each evaluation): ``eval/value_mse`` (mean over action tokens of
``(V - G)^2``) and ``eval/explained_variance`` (``1 - Var(G - V) / Var(G)``).
"""
from __future__ import annotations

import os
import struct
from typing import Callable, Sequence

import numpy as np

from sao import multihost
from sao.learner.batch import make_train_batch
from sao.rpc import codec
from sao.types import Trajectory

VALUE_EPISODES_FILE = "value_heldout.bin"


def mc_returns(rewards: np.ndarray, action_mask: np.ndarray, gamma: float) -> np.ndarray:
    """Monte-Carlo returns f64[B, T]: at action token t, ``gamma^(n_after) * R``, with
    ``n_after`` the action tokens after t and R the row's reward sum (on its last
    action token); 0 off the mask. rewards f32[B, T], action_mask bool[B, T]."""
    mask = np.asarray(action_mask, bool)
    total = np.asarray(rewards, np.float64).sum(axis=1, keepdims=True)
    after = np.cumsum(mask[:, ::-1], axis=1)[:, ::-1] - mask        # action tokens after t
    return np.where(mask, total * np.power(float(gamma), after), 0.0)


def value_errors(values: np.ndarray, returns: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """``{"eval/value_mse", "eval/explained_variance"}`` over the masked tokens
    (explained variance 0 when the returns do not vary; {} with no tokens)."""
    m = np.asarray(mask, bool)
    if not m.any():
        return {}
    v, g = np.asarray(values, np.float64)[m], np.asarray(returns, np.float64)[m]
    var = g.var()
    return {"eval/value_mse": float(np.mean((v - g) ** 2)),
            "eval/explained_variance": float(1.0 - (g - v).var() / var) if var > 0 else 0.0}


def heldout_value_metrics(critic_values: Callable, trajs: Sequence[Trajectory], *,
                          buckets: Sequence[int], batch_size: int, pad_id: int,
                          gamma: float) -> dict[str, float]:
    """Scores ``critic_values(tokens i32[B, T]) -> f32[B, T]`` on ``trajs`` (all rows pooled)."""
    vals, rets, masks = [], [], []
    for i in range(0, len(trajs), batch_size):
        b = make_train_batch(trajs[i:i + batch_size], buckets=buckets, batch_size=batch_size,
                             pad_id=pad_id)
        mask = b.action_mask & (b.row_mask > 0)[:, None]
        vals.append(np.asarray(critic_values(b.tokens), np.float64)[mask])
        rets.append(mc_returns(b.rewards, mask, gamma)[mask])
        masks.append(np.ones(int(mask.sum()), bool))
    if not vals:
        return {}
    return value_errors(np.concatenate(vals), np.concatenate(rets), np.concatenate(masks))


def save_episodes(path: str, trajs: Sequence[Trajectory]) -> None:
    """Writes ``trajs`` (codec records, 4-byte length prefixes) to ``path`` atomically."""
    data = b"".join(struct.pack("<I", len(r)) + r for r in map(codec.encode, trajs))
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def load_episodes(path: str) -> list[Trajectory]:
    """Reads `save_episodes`' file; raises ``codec.CodecError`` / ValueError on a bad file."""
    with open(path, "rb") as f:
        data = f.read()
    out, i = [], 0
    while i < len(data):
        if i + 4 > len(data):
            raise ValueError(f"{path}: truncated record header")
        (n,) = struct.unpack_from("<I", data, i)
        if i + 4 + n > len(data):
            raise ValueError(f"{path}: truncated record")
        out.append(codec.decode(data[i + 4:i + 4 + n]))
        i += 4 + n
    return out


def make_value_eval(cfg, learner, sampler, heldout: Sequence[dict], workdir: str,
                    log: Callable[[str], None] = print) -> Callable:
    """``(states) -> metrics``: the critic on the fixed episode set ({} without a critic,
    with ``eval.value_episodes`` = 0, or in a multi-process run: not wired there yet).

    The set is ``eval.value_episodes`` episodes of the first held-out prompts, sampled on
    the first call (the starting policy) and saved to ``eval.value_episodes_file``
    (default ``<workdir>/value_heldout.bin``, a local path); an existing file is used as it is.
    """
    lc = learner.cfg
    n = int(cfg.eval.get("value_episodes", 0))
    path = cfg.eval.get("value_episodes_file", "") or os.path.join(workdir, VALUE_EPISODES_FILE)
    cache: list[Trajectory] = []

    def value_eval(states) -> dict:
        if not lc.uses_critic or n < 1 or not heldout or multihost.process_count() > 1:
            return {}
        if not cache:
            if os.path.exists(path):
                cache.extend(load_episodes(path))
            else:
                trajs = [t for t in sampler.sample(states, list(heldout[:n])) if t is not None]
                if not trajs:
                    return {}
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                save_episodes(path, trajs)
                cache.extend(trajs)
                log(f"value evaluation set: {len(trajs)} held-out episodes saved to {path}")
        return heldout_value_metrics(lambda tokens: learner.critic_values(states, tokens), cache,
                                     buckets=lc.length_buckets, batch_size=lc.batch_size,
                                     pad_id=lc.pad_id, gamma=lc.gamma)
    return value_eval
