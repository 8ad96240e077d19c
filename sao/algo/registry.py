"""Config strings -> kernels: one implementation per kernel, chosen by name.

Policy losses share one signature (see :mod:`sao.algo.policy_losses`)::

    loss_fn(logprobs, behaviour_logprobs, advantages, action_mask, **hparams)
        -> (per_token f32[B, T], diagnostics)

Advantage estimators come in three shapes, recorded in
:data:`ADVANTAGE_KINDS` so callers can dispatch without string matching:

* ``"token"``: ``fn(rewards f32[B, T], values f32[B, T], action_mask, **hp)
  -> (advantages, returns)`` (``gae``);
* ``"token_outcome"``: ``fn(rewards f32[B, T], action_mask, **hp) ->
  advantages f32[B, T]`` (``reinforce_pp``);
* ``"group"``: ``fn(rewards f32[N], group_ids i32[N], **hp) -> f32[N]``
  (``grpo``, ``dr_grpo``, ``rloo``), broadcast with
  :func:`sao.algo.broadcast_to_actions`;
* ``"stateful"``: ``fn(rewards f32[N], slots i32[N], state, **hp) ->
  (f32[N], state)`` (``running_mean``).
"""
from __future__ import annotations

import functools
from typing import Callable

from sao.algo.outcome import (dr_grpo_advantages, grpo_advantages, reinforce_pp_advantages,
                              rloo_advantages, running_mean_advantages)
from sao.algo.policy_losses import dis_policy_loss, gspo_loss, ppo_clip_loss, tis_policy_loss
from sao.algo.skip_gae import gae

POLICY_LOSSES: dict[str, Callable] = {
    "sao_dis": dis_policy_loss,
    "ppo_clip": ppo_clip_loss,
    "gspo": gspo_loss,
    "grpo_tis": functools.partial(tis_policy_loss, mode="truncate"),
    "grpo_mis": functools.partial(tis_policy_loss, mode="mask"),
}

ADVANTAGE_ESTIMATORS: dict[str, Callable] = {
    "gae": gae,
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
    "running_mean": running_mean_advantages,
    "reinforce_pp": reinforce_pp_advantages,
}

ADVANTAGE_KINDS: dict[str, str] = {
    "gae": "token", "reinforce_pp": "token_outcome", "grpo": "group", "dr_grpo": "group",
    "rloo": "group", "running_mean": "stateful",
}


def _lookup(table: dict[str, Callable], name: str, what: str) -> Callable:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; valid: {sorted(table)}") from None


def get_policy_loss(name: str) -> Callable:
    """Policy loss by config name; raises ValueError listing valid names."""
    return _lookup(POLICY_LOSSES, name, "policy loss")


def get_advantage_estimator(name: str) -> Callable:
    """Advantage estimator by config name; raises ValueError listing valid names."""
    return _lookup(ADVANTAGE_ESTIMATORS, name, "advantage estimator")
