"""Loss-and-update steps for the actor and the critic (pure functions, jitted by
`sao.learner.learner.Learner` with explicit shardings and buffer donation).

Gradient accumulation: a batch of B rows is cut into ``num_micro``
micro-batches (micro-batch j holds rows ``j, j + n, j + 2n, ...`` so each
data-parallel shard contributes to every micro-batch); each micro-batch loss is
aggregated with the *global* token / sequence counts, so the sum of micro-batch
losses and gradients equals the whole-batch ones (up to float summation order).
One optimiser update per call. Non-finite loss or gradient: the state is kept
unchanged (`sao.learner.guards`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from sao import algo
from sao.algo.lag_masks import band_counts_by_lag
from sao.learner.guards import finite_guard, select_tree
from sao.learner.state import ModelDef, TrainState
from sao.models import predict_values, token_logprobs, token_logprobs_and_entropy

# Policy losses whose ratio is against the rollout engine's log-probs (DIS, and
# PPO clip so that the GRPO / VAPO baselines see the engine's lag: with one
# update per batch a ratio against the learner's own policy is 1 and the clip
# never binds; docs/algorithm.md §7); every other registry loss is taken
# against the learner's policy at the start of the step (GSPO, TIS / MIS).
ROLLOUT_BEHAVIOUR_LOSSES = ("sao_dis", "ppo_clip")
# Registry losses that also take the engine's log-probs as a keyword (TIS/MIS).
ROLLOUT_KWARG_LOSSES = ("grpo_tis", "grpo_mis")
# Lag bins of the per-lag band counts: lags 0 .. LAG_BINS - 2, then ">= LAG_BINS - 1".
LAG_BINS = 9


def micro_split(x: jax.Array, num_micro: int) -> jax.Array:
    """``[B, ...] -> [num_micro, B // num_micro, ...]``, micro j = rows j::num_micro."""
    b = x.shape[0]
    return jnp.swapaxes(x.reshape((b // num_micro, num_micro) + x.shape[1:]), 0, 1)


def _combine(a: dict, b: dict) -> dict:
    # "sum" / "count": additive over micro-batches; "max": maxima
    return {k: jax.tree.map(jnp.maximum if k == "max" else jnp.add, a[k], b[k]) for k in a}


def accumulate_grads(loss_fn: Callable, params, inputs: dict, num_micro: int):
    """Sum over micro-batches of ``value_and_grad(loss_fn)``.

    ``loss_fn(params, inputs) -> (loss f32[], {"sum": {...}, "max": {...}})``
    must be additive over rows (losses aggregated with global counts).
    Returns ``((loss, aux), grads)`` for the whole batch.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if num_micro == 1:
        return grad_fn(params, inputs)
    micro = jax.tree.map(lambda x: micro_split(x, num_micro), inputs)
    first = jax.tree.map(lambda x: x[0], micro)
    shapes = jax.eval_shape(grad_fn, params, first)
    init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    init[0][1]["max"] = jax.tree.map(lambda s: jnp.full(s.shape, -jnp.inf, s.dtype),
                                     shapes[0][1]["max"])

    def body(carry, mb):
        (c_loss, c_aux), c_grads = carry
        (loss, aux), grads = grad_fn(params, mb)
        return ((c_loss + loss, _combine(c_aux, aux)),
                jax.tree.map(jnp.add, c_grads, grads)), None

    out, _ = jax.lax.scan(body, init, micro)
    return out


def apply_update(state: TrainState, grads, loss, tx: optax.GradientTransformation,
                 trainable) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimiser update with the non-finite guard; frozen leaves (False in
    the static ``trainable`` mask) are carried over untouched (bit-identical)."""
    train_grads = jax.tree.map(lambda g, t: g if t else None, grads, trainable)
    ok, metrics = finite_guard(loss, train_grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    stepped = optax.apply_updates(state.params, updates)
    params = jax.tree.map(lambda new, old, t: new if t else old, stepped, state.params, trainable)
    new = TrainState(params=params, opt_state=opt_state, step=state.step + 1)
    metrics["grad_norm"] = optax.global_norm(
        [g for g in jax.tree.leaves(train_grads) if g is not None])
    return select_tree(ok, new, state), metrics


def _finalise(aux: dict, count) -> dict[str, jax.Array]:
    out = {k: v / jnp.maximum(count, 1.0) for k, v in aux["sum"].items()}
    out.update(aux["max"])
    if "count" in aux:                   # raw counts (e.g. per lag), summed over micro-batches
        out.update(aux["count"])
    return out


def _diag_to_aux(diag: dict, count) -> dict:
    """Masked-mean diagnostics of one micro-batch -> additive sums / maxima."""
    aux = {"sum": {}, "max": {}}
    for k, v in diag.items():
        if k.startswith("max"):
            aux["max"][k] = v
        elif not k.startswith("num_"):  # counts are reported by the caller
            aux["sum"][k] = v * count
    return aux


def critic_values(model_def: ModelDef, params, tokens: jax.Array) -> jax.Array:
    """Critic values f32[B, T] (aligned as in architecture.md)."""
    return predict_values(model_def.merge(params), tokens)


def actor_logprobs(model_def: ModelDef, params, tokens: jax.Array, temperature) -> jax.Array:
    """Policy log-probs f32[B, T] at the rollout temperature."""
    return token_logprobs(model_def.merge(params), tokens, temperature=temperature)


def critic_grads(params, inputs: dict, *, model_def: ModelDef, num_micro: int,
                 value_clip: float):
    """Value loss ``0.5 (V - R)^2`` (token mean over action tokens) and its
    gradient, accumulated over ``num_micro`` micro-batches.

    Args:
      inputs: ``tokens i32[B, T]``, ``action_mask bool[B, T]``, ``returns
        f32[B, T]``, ``old_values f32[B, T]`` (for value clipping).
    Returns:
      ``((loss, aux), grads, count)`` with ``count`` the action-token count.
    """
    count = jnp.sum(inputs["action_mask"]).astype(jnp.float32)

    def loss_fn(params, mb):
        values = predict_values(model_def.merge(params), mb["tokens"])
        per_tok, diag = algo.value_loss(values, mb["returns"], mb["action_mask"],
                                        old_values=mb["old_values"] if value_clip else None,
                                        clip_range=value_clip or None)
        loss = algo.aggregate(per_tok, mb["action_mask"], "token-mean", global_token_count=count)
        return loss, _diag_to_aux(diag, jnp.sum(mb["action_mask"]).astype(jnp.float32))

    (loss, aux), grads = accumulate_grads(loss_fn, params, inputs, num_micro)
    return (loss, aux), grads, count


def critic_step(state: TrainState, inputs: dict, *, model_def: ModelDef, tx, trainable,
                num_micro: int, value_clip: float):
    """One critic update (`critic_grads`, then `apply_update`).

    Returns:
      ``(state, metrics)``: ``value_loss``, ``grad_norm``, skip flags,
      ``value_clip_fraction``, ``value_mean``, ``return_mean``.
    """
    (loss, aux), grads, count = critic_grads(state.params, inputs, model_def=model_def,
                                             num_micro=num_micro, value_clip=value_clip)
    state, metrics = apply_update(state, grads, loss, tx, trainable)
    metrics.update(_finalise(aux, count), value_loss=loss)
    return state, metrics


def actor_grads(params, ref_params, inputs: dict, *, model_def: ModelDef, num_micro: int,
                policy_loss: str, hparams: dict[str, Any], agg_mode: str, temperature: float,
                kl_coef: float, kl_estimator: str, entropy_coef: float):
    """Actor loss with a registry policy loss (docs/algorithm.md §4) and its
    gradient, accumulated over ``num_micro`` micro-batches.

    Args:
      ref_params: reference policy params for the KL term, or None.
      inputs: ``tokens``, ``policy_mask bool[B, T]`` (action tokens that enter
        the policy loss), ``advantages f32[B, T]``, ``rollout_logprobs f32[B, T]``,
        optional ``lags i32[B, T]`` (learner version minus the token's version):
        then the result's aux holds ``lag_counts`` (`sao.algo.lag_masks.band_counts_by_lag`
        of the ratio against ``rollout_logprobs`` with ``hparams``' band, ``LAG_BINS`` bins).
      policy_loss: registry name; ``sao_dis`` and ``ppo_clip`` take the ratio
        against ``rollout_logprobs``; other losses against the learner's policy at the
        start of the step (one update per step, so this is ``sg(log pi_theta)``
        from the same forward pass).
      agg_mode: `sao.algo.aggregate` mode, normalised by global counts.
    Returns:
      ``((loss, aux), grads, count)`` with ``count`` the policy-token count.
    """
    loss_fn_reg = algo.get_policy_loss(policy_loss)
    mask_all = inputs["policy_mask"]
    count = jnp.sum(mask_all).astype(jnp.float32)
    seq_count = jnp.sum(jnp.any(mask_all, axis=1)).astype(jnp.float32)
    agg = dict(global_token_count=count, global_seq_count=seq_count)

    def loss_fn(params, mb):
        mask = mb["policy_mask"]
        logp, ent = token_logprobs_and_entropy(model_def.merge(params), mb["tokens"],
                                               temperature=temperature)
        if policy_loss in ROLLOUT_BEHAVIOUR_LOSSES:
            behaviour = mb["rollout_logprobs"]
        else:
            behaviour = jax.lax.stop_gradient(logp)
        kw = dict(hparams)
        if policy_loss in ROLLOUT_KWARG_LOSSES:
            kw["rollout_logprobs"] = mb["rollout_logprobs"]
        per_tok, diag = loss_fn_reg(logp, behaviour, mb["advantages"], mask, **kw)
        pg = algo.aggregate(per_tok, mask, agg_mode, **agg)
        n = jnp.sum(mask).astype(jnp.float32)
        loss = pg
        if entropy_coef:
            loss = loss - entropy_coef * algo.aggregate(ent, mask, agg_mode, **agg)
        aux = _diag_to_aux(diag, n)
        if "lags" in mb:                 # where the ratio leaves the band: per lag, per side
            log_ratio = jax.lax.stop_gradient(logp) - mb["rollout_logprobs"]
            aux["count"] = {"lag_counts": band_counts_by_lag(
                log_ratio, mb["lags"], mask, eps_low=hparams["eps_low"],
                eps_high=hparams["eps_high"], num_bins=LAG_BINS)}
        aux["sum"]["entropy"] = jax.lax.stop_gradient(jnp.sum(jnp.where(mask, ent, 0.0)))
        aux["sum"]["policy_loss"] = jax.lax.stop_gradient(pg) * count
        if ref_params is not None and kl_coef:
            ref_lp = jax.lax.stop_gradient(
                token_logprobs(model_def.merge(ref_params), mb["tokens"], temperature=temperature))
            kl = algo.kl_penalty(logp, ref_lp, mask, kind=kl_estimator)
            loss = loss + kl_coef * algo.aggregate(kl, mask, agg_mode, **agg)
            aux["sum"]["kl"] = jax.lax.stop_gradient(jnp.sum(kl))
        return loss, aux

    (loss, aux), grads = accumulate_grads(loss_fn, params, inputs, num_micro)
    return (loss, aux), grads, count


def actor_step(state: TrainState, ref_params, inputs: dict, *, tx, trainable, **kw):
    """One actor update (`actor_grads` with ``**kw``, then `apply_update`).

    Returns:
      ``(state, metrics)``: ``policy_loss``, ``loss``, ``grad_norm``,
      ``entropy``, ``kl`` (when enabled), loss diagnostics (mask fractions,
      ratio statistics), ``num_policy_tokens``, skip flags.
    """
    (loss, aux), grads, count = actor_grads(state.params, ref_params, inputs, **kw)
    state, metrics = apply_update(state, grads, loss, tx, trainable)
    metrics.update(_finalise(aux, count), loss=loss, num_policy_tokens=count)
    return state, metrics
