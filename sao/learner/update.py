"""The SAO update for one batch, the GRPO-style baseline update, and value
pretraining (docs/algorithm.md §3-§5, §7).

These run the learner's compiled steps (`CompiledSteps`, built with their
shardings by `sao.learner.learner.Learner`, whose ``update`` and
``value_pretrain`` methods call `update_step` and `value_pretrain`).

`update_step` (``advantage_estimator="gae"``)::

    V      = critic(batch)                                  values at action tokens
    A      = skip-obs GAE(r, V, λ = 1 - 1/(α·l))            actor advantages (Eq. 4-5)
    R      = skip-obs GAE(r, V, λ = λ_critic) + V           critic targets (λ_critic = 1: MC)
    repeat K times: critic ← critic − ∇ 0.5 (V − R)²        on action tokens
    if learner step >= warm-up: actor ← actor − ∇ L_DIS(A)  (policy loss from the registry)

With a critic-free ``advantage_estimator`` (``grpo``, ``dr_grpo``, ``rloo``,
``reinforce_pp``, ``given``; `outcome_targets`) there is no critic: e.g. for
``grpo`` ``A`` is the group-normalised outcome reward of each row's prompt
group (rows sharing a ``prompt_id``), broadcast onto its action tokens, and
the actor step runs every time. Truncated rows (``finish="length"``) are terminal with the
environment's reward by default; ``truncation="drop"`` removes them from the
policy loss (the critic still fits them).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from sao import algo
from sao.algo.lag_masks import rates_by_lag
from sao.learner.batch import TrainBatch
from sao.learner.config import LearnerConfig
from sao.learner.guards import report_skipped
from sao.learner.mesh import host_scalar, put_batch
from sao.learner.state import LearnerStates, TrainState


@dataclasses.dataclass(frozen=True)
class CompiledSteps:
    """The jitted steps an update runs, with the learner's shardings and
    buffer donation (built by `sao.learner.learner.Learner`).

    Attributes:
      mesh: the learner mesh; the steps are called under ``jax.set_mesh(mesh)``.
      actor_step: ``(actor, ref_params, inputs) -> (actor, metrics)``, the
        policy update `sao.learner.steps.actor_step`; donates ``actor``.
      critic_step: ``(critic, inputs) -> (critic, metrics)``, the critic update
        `sao.learner.steps.critic_step`; donates ``critic``. None without a critic.
      critic_values: ``(critic params, tokens i32[B, T]) -> f32[B, T]``
        (`sao.learner.steps.critic_values`). None without a critic.
    """

    mesh: Mesh
    actor_step: Callable[[TrainState, Any, dict], tuple[TrainState, dict]]
    critic_step: Callable[[TrainState, dict], tuple[TrainState, dict]] | None = None
    critic_values: Callable[[Any, jax.Array], jax.Array] | None = None


def to_host(metrics: dict) -> dict[str, float]:
    """Metrics dict of device scalars -> python floats."""
    return {k: float(np.asarray(v)) for k, v in jax.device_get(metrics).items()}


def _staleness(batch: TrainBatch, mask, version):
    lag = jnp.where(mask, version - batch.policy_version, 0).astype(jnp.float32)
    return {"batch/staleness_mean": algo.masked_mean(lag, mask),
            "batch/staleness_max": jnp.max(jnp.where(mask, lag, 0.0))}


def token_lags(batch: TrainBatch, version):
    """i32[B, T]: learner version minus the version that sampled each token (0 off the tokens)."""
    return jnp.where(batch.policy_version >= 0, version - batch.policy_version, 0).astype(jnp.int32)


def _masks(batch: TrainBatch, drop_truncated: bool):
    action = batch.action_mask & (batch.row_mask > 0)[:, None]
    policy = action & ~batch.truncated[:, None] if drop_truncated else action
    return action, policy


@functools.partial(jax.jit, static_argnames=("gamma", "alpha", "lam_policy", "lam_critic",
                                             "whiten", "drop_truncated"))
def gae_targets(batch: TrainBatch, values, version, *, gamma: float, alpha: float,
                lam_policy: float | None, lam_critic: float, whiten: bool, drop_truncated: bool):
    """Advantages and critic targets from critic values.

    Args:
      batch: a placed `TrainBatch` ``[B, T]``.
      values: f32[B, T] critic values (``sao.models.predict_values``).
      version: i32[] learner policy version (for staleness).
      lam_policy: fixed actor λ, or None for length-adaptive ``1 - 1/(alpha l)``.
    Returns:
      dict with ``advantages``, ``returns`` (f32[B, T]), ``action_mask``,
      ``policy_mask`` (bool[B, T]) and ``metrics``.
    """
    action, policy = _masks(batch, drop_truncated)
    lam = algo.length_adaptive_lambda(action, alpha) if lam_policy is None else lam_policy
    adv, _ = algo.gae(batch.rewards, values, action, gamma=gamma, lam=lam)
    _, returns = algo.gae(batch.rewards, values, action, gamma=gamma, lam=lam_critic)
    if whiten:
        adv = algo.masked_whiten(adv, policy)
    metrics = {"critic/explained_variance": algo.explained_variance(values, returns, action),
               "batch/advantage_mean": algo.masked_mean(adv, policy),
               "batch/return_mean": algo.masked_mean(returns, action),
               "batch/num_action_tokens": jnp.sum(action).astype(jnp.float32),
               "batch/num_rows": jnp.sum(batch.row_mask),
               "batch/num_truncated": jnp.sum(batch.truncated & (batch.row_mask > 0)),
               **_staleness(batch, action, version)}
    return dict(advantages=adv, returns=returns, action_mask=action, policy_mask=policy,
                metrics=metrics)


@functools.partial(jax.jit, static_argnames=("estimator", "gamma", "whiten", "drop_truncated"))
def outcome_targets(batch: TrainBatch, version, seq_advantages=None, *, estimator: str,
                    gamma: float, whiten: bool, drop_truncated: bool):
    """Critic-free advantages, broadcast onto the policy's action tokens.

    ``estimator``: a ``sao.algo`` registry group estimator (``grpo``,
    ``dr_grpo``, ``rloo``: outcome reward per row, groups = ``group_ids``),
    ``reinforce_pp`` (token returns, whitened), or ``given`` (``seq_advantages
    f32[B]`` computed by the caller, e.g. ``sao.algo.running_mean_advantages``).
    Returns the outputs of `gae_targets` minus ``returns``.
    """
    action, policy = _masks(batch, drop_truncated)
    kind = algo.ADVANTAGE_KINDS.get(estimator, estimator)
    if kind == "group":
        seq = algo.get_advantage_estimator(estimator)(jnp.sum(batch.rewards, axis=1),
                                                      batch.group_ids)
        adv = algo.broadcast_to_actions(seq, policy)
    elif kind == "token_outcome":
        adv = jnp.where(policy, algo.get_advantage_estimator(estimator)(
            batch.rewards, action, gamma=gamma), 0.0)
    else:
        adv = algo.broadcast_to_actions(seq_advantages, policy)
    if whiten:
        adv = algo.masked_whiten(adv, policy)
    metrics = {"batch/advantage_mean": algo.masked_mean(adv, policy),
               "batch/num_action_tokens": jnp.sum(action).astype(jnp.float32),
               "batch/num_rows": jnp.sum(batch.row_mask),
               "batch/num_truncated": jnp.sum(batch.truncated & (batch.row_mask > 0)),
               **_staleness(batch, action, version)}
    return dict(advantages=adv, action_mask=action, policy_mask=policy, metrics=metrics)


def _prefixed(prefix: str, metrics: dict) -> dict:
    return {f"{prefix}/{k}": v for k, v in metrics.items()}


def update_step(cfg: LearnerConfig, steps: CompiledSteps, states: LearnerStates,
                batch: TrainBatch, seq_advantages=None) -> tuple[LearnerStates, dict[str, float]]:
    """One learner step on one batch (module doc). Donates ``states``.

    Args:
      cfg: the learner config (estimator, λ, K critic steps, warm-up, ...).
      steps: the learner's compiled steps (critic ones required when
        ``cfg.uses_critic``).
      states: current `LearnerStates`.
      batch: a host or placed `TrainBatch` with ``B = cfg.batch_size``.
      seq_advantages: f32[B] per-row advantages, required with
        ``advantage_estimator="given"`` and rejected otherwise.
    Returns:
      ``(new_states, metrics)``: python floats keyed ``batch/...``,
      ``critic/...`` (last of the K critic steps), ``actor/...`` (absent
      during critic warm-up), ``learner/step``, ``learner/policy_version``,
      ``learner/actor_updated``, ``learner/nonfinite_skips`` (1 when a
      non-finite loss or gradient voided an update of this step; a warning
      names the cause: `sao.learner.guards.report_skipped`).
    Raises:
      ValueError: ``seq_advantages`` given without ``advantage_estimator="given"``
        (or missing with it) or not f32[B]; a batch with another B.
    """
    if (seq_advantages is not None) != (cfg.advantage_estimator == "given"):
        raise ValueError("seq_advantages must be given exactly when "
                         f"advantage_estimator='given' (it is {cfg.advantage_estimator!r})")
    if seq_advantages is not None:
        seq_advantages = np.asarray(seq_advantages, np.float32)
        if seq_advantages.shape != (cfg.batch_size,):
            raise ValueError(f"seq_advantages must be f32[{cfg.batch_size}], got "
                             f"{seq_advantages.shape}")
    if isinstance(batch.tokens, np.ndarray):
        batch = put_batch(batch, steps.mesh, cfg.batch_size)
    step = int(states.step)
    version = states.actor.step
    critic = states.critic
    metrics: dict = {}
    with jax.set_mesh(steps.mesh):
        if cfg.uses_critic:
            values = steps.critic_values(critic.params, batch.tokens)
            t = gae_targets(batch, values, version, gamma=cfg.gamma, alpha=cfg.alpha,
                            lam_policy=cfg.lam_policy, lam_critic=cfg.lam_critic,
                            whiten=cfg.whiten_advantages,
                            drop_truncated=cfg.truncation == "drop")
            inputs = dict(tokens=batch.tokens, action_mask=t["action_mask"],
                          returns=t["returns"], old_values=values)
            for _ in range(cfg.critic_steps):
                critic, cm = steps.critic_step(critic, inputs)
                metrics.update(_prefixed("critic", cm))
        else:
            t = outcome_targets(batch, version, seq_advantages,
                                estimator=cfg.advantage_estimator, gamma=cfg.gamma,
                                whiten=cfg.whiten_advantages,
                                drop_truncated=cfg.truncation == "drop")
        metrics.update(t["metrics"])
        actor = states.actor
        update_actor = not cfg.uses_critic or step >= cfg.critic_warmup_steps
        if update_actor:
            inputs = dict(tokens=batch.tokens, policy_mask=t["policy_mask"],
                          advantages=t["advantages"], rollout_logprobs=batch.rollout_logprobs,
                          lags=token_lags(batch, version))
            actor, am = steps.actor_step(actor, states.ref_params, inputs)
            lag_counts = am.pop("lag_counts", None)
            metrics.update(_prefixed("actor", am))
    new_step = host_scalar(step + 1, jnp.int32, states.step.sharding)
    new = LearnerStates(actor=actor, critic=critic, ref_params=states.ref_params, step=new_step)
    out = to_host(metrics)
    if update_actor and lag_counts is not None:
        out.update(rates_by_lag(jax.device_get(lag_counts), "dis/"))
    out.update({"learner/step": float(step + 1), "learner/actor_updated": float(update_actor),
                "learner/policy_version": float(new.policy_version),
                "learner/nonfinite_skips": report_skipped(step + 1, out)})
    return new, out


def value_pretrain(cfg: LearnerConfig, steps: CompiledSteps, states: LearnerStates,
                   batches: Iterable[TrainBatch], *, ev_threshold: float | None = None,
                   max_steps: int | None = None) -> tuple[LearnerStates, dict]:
    """Fits the critic to Monte-Carlo returns before RL (VC-PPO style, docs/algorithm.md §5).

    Cycles over ``batches`` (built from trajectories of the initial policy);
    before each critic step it measures the explained variance of the critic
    on the batch and stops once it reaches ``ev_threshold``, or after
    ``max_steps`` critic steps (defaults: ``cfg.value_pretrain_ev`` /
    ``cfg.value_pretrain_steps``). The actor is untouched and the learner step
    counter does not move. Donates ``states``.

    Returns:
      ``(states, {"steps", "explained_variance", "history"})``; ``history`` is
      the explained variance measured before each step (and the final one).
    Raises:
      ValueError: without a critic, with no batches, or a batch with another B.
    """
    if not cfg.uses_critic:
        raise ValueError("value_pretrain needs a critic (advantage_estimator='gae')")
    ev_threshold = cfg.value_pretrain_ev if ev_threshold is None else ev_threshold
    max_steps = cfg.value_pretrain_steps if max_steps is None else max_steps
    placed = [b if not isinstance(b.tokens, np.ndarray) else put_batch(b, steps.mesh,
                                                                       cfg.batch_size)
              for b in batches]
    if not placed:
        raise ValueError("value_pretrain needs at least one batch")
    critic, history, n = states.critic, [], 0
    with jax.set_mesh(steps.mesh):
        for batch in itertools.cycle(placed):
            values = steps.critic_values(critic.params, batch.tokens)
            t = gae_targets(batch, values, states.actor.step, gamma=cfg.gamma, alpha=cfg.alpha,
                            lam_policy=cfg.lam_policy, lam_critic=1.0, whiten=False,
                            drop_truncated=False)
            ev = float(t["metrics"]["critic/explained_variance"])
            history.append(ev)
            if ev >= ev_threshold or n >= max_steps:
                break
            critic, _ = steps.critic_step(critic, dict(
                tokens=batch.tokens, action_mask=t["action_mask"], returns=t["returns"],
                old_values=values))
            n += 1
    new = LearnerStates(actor=states.actor, critic=critic, ref_params=states.ref_params,
                        step=states.step)
    return new, {"steps": n, "explained_variance": history[-1], "history": history}
