"""A tiny deterministic learner for fleet tests: a unigram softmax policy
(``logits: f32[V]``) trained with a DIS-shaped loss (docs/algorithm.md §4, with a
wide ratio band (1e-3, 1e3) because the simulated engine's log-probs are far
from a uniform policy) on ``reward - mean reward`` advantages. A fast stand-in for the project
learner where a test runs it many times (hypothesis examples); what matters is
that it is deterministic and that bad trajectories would poison it (NaN) if
they got through. test_learner_integration.py uses the real SAO update."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sao.learner.batch import make_train_batch


def init(vocab: int) -> jax.Array:
    return jnp.zeros((vocab,), jnp.float32)


@jax.jit
def _step(logits, tokens, action_mask, rollout_logprobs, rewards, row_mask, lr):
    def loss_fn(lg):
        logp = jax.nn.log_softmax(lg)[tokens]
        ratio = jnp.exp(logp - rollout_logprobs)
        keep = (ratio > 1e-3) & (ratio < 1e3) & action_mask
        seq_reward = rewards.sum(-1)
        adv = (seq_reward - (seq_reward * row_mask).sum() / jnp.maximum(row_mask.sum(), 1))[:, None]
        per_token = -jax.lax.stop_gradient(jnp.where(keep, ratio, 0.0)) * adv * logp
        return jnp.where(action_mask, per_token, 0.0).sum() / jnp.maximum(action_mask.sum(), 1)
    return logits - lr * jax.grad(loss_fn)(logits)


def update(logits, trajectories, *, batch_size: int, lr: float = 0.5, pad_id: int = 256):
    b = make_train_batch(trajectories, buckets=(64, 256, 1024, 4096), batch_size=batch_size,
                         pad_id=pad_id)
    return _step(logits, b.tokens, b.action_mask, b.rollout_logprobs, b.rewards, b.row_mask,
                 np.float32(lr))
