"""Supervised warm start: next-token cross-entropy on demonstrations' action tokens.

The quick start warm-starts its tiny policy on tool-integrated demonstrations
(sao/data/demonstrations.py) before RL. The loss is the mean negative log-likelihood of
the action tokens (``loss_mask``), computed with ``sao.models.token_logprobs``
(the same f32 head / log-softmax the learner uses). Each batch is cut to its
longest row rounded up to a multiple of ``pad_multiple`` tokens (`batch_width`):
the padding after a row changes no loss or gradient (causal attention,
``loss_mask``), only FLOPs, and the step compiles once per width (at most
``max_len / pad_multiple`` widths).

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


def batch_width(longest: int, max_len: int, pad_multiple: int) -> int:
    """Padded width of a batch whose longest row has ``longest`` tokens: rounded up to a
    multiple of ``pad_multiple``, at most ``max_len``. Raises ValueError if ``pad_multiple``
    < 1 or ``longest`` is not in ``[0, max_len]``."""
    if pad_multiple < 1 or not 0 <= longest <= max_len:
        raise ValueError(f"need pad_multiple >= 1 and 0 <= longest <= max_len, got {pad_multiple}, "
                         f"{longest}, {max_len}")
    return min(max_len, max(pad_multiple, -(-longest // pad_multiple) * pad_multiple))


@nnx.jit
def _train_step(model, optimizer, tokens, loss_mask):
    loss, grads = nnx.value_and_grad(sft_loss)(model, tokens, loss_mask)
    optimizer.update(model, grads)
    return loss


def train_sft(model, data: SFTArrays, *, steps: int, batch_size: int, lr: float,
              warmup_steps: int = 50, seed: int = 0, pad_multiple: int = 16,
              log: Callable[[int, dict], None] | None = None, log_every: int = 25) -> dict:
    """Trains ``model`` in place on ``data`` for ``steps`` AdamW steps (warm-up + cosine decay).

    Args:
      model: a ``sao.models.Transformer``.
      data: tokenised demonstrations (``sao.data.demonstrations.tokenize_demonstrations``).
      steps, batch_size: optimiser steps and rows per step (sampled with replacement).
      lr: peak learning rate; ``warmup_steps`` linear warm-up.
      pad_multiple: each batch is cut to `batch_width` of its longest row (fewer FLOPs).
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
        width = batch_width(int(data.lengths[idx].max()), max_len, pad_multiple)
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
