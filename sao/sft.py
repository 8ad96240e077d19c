"""Supervised warm start: next-token cross-entropy on demonstrations' action tokens.

The quick start warm-starts its tiny policy on tool-integrated demonstrations
(sao/data/demonstrations.py) before RL. The loss is the mean negative log-likelihood of
the action tokens (``loss_mask``), computed with ``sao.models.token_logprobs``
(the same f32 head / log-softmax the learner uses). Padded batches use at most
two lengths (``short_len`` and ``max_len``), so the step compiles at most twice.

The result is cached in ``<workdir>/sft`` as a published params checkpoint
(``sao.ckpt.publish``, version 0) plus ``sft/result.json``; a rerun loads it
instead of training again.
"""
from __future__ import annotations

import json
import os
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

from sao import ckpt
from sao.data.demonstrations import SFTArrays
from sao.models import token_logprobs

RESULT_FILE = "result.json"


def sft_loss(model, tokens: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Mean NLL over action tokens: ``tokens`` i32[B, T], ``loss_mask`` bool[B, T] -> f32[]."""
    lp = token_logprobs(model, tokens)
    mask = loss_mask.astype(jnp.float32)
    return -jnp.sum(lp * mask) / jnp.maximum(jnp.sum(mask), 1.0)


@nnx.jit
def _train_step(model, optimizer, tokens, loss_mask):
    loss, grads = nnx.value_and_grad(sft_loss)(model, tokens, loss_mask)
    optimizer.update(model, grads)
    return loss


def train_sft(model, data: SFTArrays, *, steps: int, batch_size: int, lr: float,
              warmup_steps: int = 50, seed: int = 0, short_len: int = 64,
              log: Callable[[int, dict], None] | None = None, log_every: int = 25) -> dict:
    """Trains ``model`` in place on ``data`` for ``steps`` AdamW steps (warm-up + cosine decay).

    Args:
      model: a ``sao.models.Transformer``.
      data: tokenised demonstrations (``sao.data.demonstrations.tokenize_demonstrations``).
      steps, batch_size: optimiser steps and rows per step (sampled with replacement).
      lr: peak learning rate; ``warmup_steps`` linear warm-up.
      short_len: batches whose rows all fit are cut to this length (fewer FLOPs).
      log: ``log(step, metrics)`` every ``log_every`` steps and at the end.
    Returns ``{"sft/loss": last loss, "sft/steps": steps, "sft/seconds": wall}``.
    Raises ValueError if ``steps`` or ``batch_size`` < 1 or the data is empty.
    """
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps}, {batch_size}")
    n, max_len = data.tokens.shape
    if n == 0:
        raise ValueError("no demonstrations")
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, min(warmup_steps, steps - 1) or 1,
                                                  steps, end_value=lr * 0.1)
    optimizer = nnx.Optimizer(model, optax.adamw(schedule, weight_decay=0.0), wrt=nnx.Param)
    rng = np.random.default_rng(seed)
    t0, loss = time.monotonic(), float("nan")
    for step in range(1, steps + 1):
        idx = rng.integers(0, n, batch_size)
        width = short_len if int(data.lengths[idx].max()) <= short_len else max_len
        loss_arr = _train_step(model, optimizer, jnp.asarray(data.tokens[idx, :width]),
                               jnp.asarray(data.loss_mask[idx, :width]))
        if log is not None and (step % log_every == 0 or step == steps):
            loss = float(loss_arr)
            log(step, {"sft/loss": loss, "sft/lr": float(schedule(step))})
    loss = float(loss_arr)
    return {"sft/loss": loss, "sft/steps": steps, "sft/seconds": time.monotonic() - t0}


def load_params(model, uri: str) -> None:
    """Loads a params-only orbax checkpoint (``sao.ckpt.publish`` layout) into ``model`` in place."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.state(model, nnx.Param))
    with ocp.StandardCheckpointer() as ckptr:
        nnx.update(model, ckptr.restore(os.path.abspath(uri), abstract))


def cached_sft(model, workdir: str, make_data: Callable[[], SFTArrays], **train_kwargs) -> dict:
    """Runs :func:`train_sft` once per workdir; later calls load the cached weights.

    Returns the training result (with ``"sft/cached": True`` when loaded).
    """
    directory = os.path.join(workdir, "sft")
    result_path = os.path.join(directory, RESULT_FILE)
    latest = ckpt.latest_published(directory)
    if latest is not None and os.path.exists(result_path):
        load_params(model, latest[1])
        with open(result_path, encoding="utf-8") as f:
            return {**json.load(f), "sft/cached": True}
    result = train_sft(model, make_data(), **train_kwargs)
    ckpt.publish(directory, 0, nnx.state(model, nnx.Param), keep=1)
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return {**result, "sft/cached": False}
