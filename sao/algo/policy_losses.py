"""Per-token policy losses: DIS (SAO), PPO clip (clip-higher, dual-clip), GSPO,
and GRPO with truncated / masked importance weights (TIS / MIS).

Every loss has the signature::

    loss_fn(logprobs, behaviour_logprobs, advantages, action_mask, **hparams)
        -> (per_token f32[B, T], diagnostics dict[str, f32 scalar])

``logprobs`` are the learner's log pi_theta(token) (the only argument that
carries gradient), ``behaviour_logprobs`` the policy the ratio is taken
against (in the learner: the rollout engine's log-probs for DIS and PPO clip,
the learner's policy at the start of the step for GSPO / TIS). Per-token values are zero off the
action mask; reduce them with :func:`sao.algo.aggregate`. Inputs may be bf16:
all arithmetic is float32. Diagnostics are means over the action tokens of
the arrays given (0 when there are none).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from sao.algo.checks import check_range
from sao.algo.masked import as_f32, as_mask, check_same_shape, masked_mean

Array = jax.Array


def _prepare(logprobs, behaviour_logprobs, advantages, action_mask):
    check_same_shape(logprobs=logprobs, behaviour_logprobs=behaviour_logprobs,
                     advantages=advantages, action_mask=action_mask)
    if jnp.ndim(logprobs) != 2:
        raise ValueError(f"expected [B, T] arrays, got shape {jnp.shape(logprobs)}")
    m = as_mask(action_mask)
    logp = as_f32(logprobs)
    log_ratio = jnp.where(m, logp - jax.lax.stop_gradient(as_f32(behaviour_logprobs)), 0.0)
    adv = jnp.where(m, as_f32(advantages), 0.0)
    return logp, log_ratio, adv, m


def _check_eps(eps_low, eps_high):
    # 1 - eps_low is the band's / clip range's lower edge: it must stay >= 0.
    check_range("eps_low", eps_low, low=0.0, high=1.0, low_inclusive=False)
    check_range("eps_high", eps_high, low=0.0, low_inclusive=False)


def _ratio_diagnostics(log_ratio, m) -> dict[str, Array]:
    return {
        "mean_ratio": masked_mean(jnp.exp(log_ratio), m),
        "max_abs_log_ratio": jnp.max(jnp.where(m, jnp.abs(log_ratio), 0.0)),
        "num_action_tokens": jnp.sum(m).astype(jnp.float32),
    }


def dis_policy_loss(logprobs, rollout_logprobs, advantages, action_mask, *,
                    eps_low: float, eps_high: float) -> tuple[Array, dict[str, Array]]:
    """SAO's direct double-sided importance sampling loss (paper Eq. 1-3).

    ``r_t = exp(logpi_theta - logpi_rollout)``; ``f(r) = r`` inside the strict
    open band ``(1 - eps_low, 1 + eps_high)`` and 0 outside (a mask, not a
    clamp); per token ``loss_t = -sg(f(r_t)) * A_t * logpi_theta(t)``. Tokens
    outside the band get no gradient whatever the sign of ``A_t``; inside, the
    gradient is the importance-weighted policy gradient ``-r_t A_t grad logpi``.

    Args:
      logprobs: f32/bf16[B, T] learner log-probs (differentiated).
      rollout_logprobs: f32/bf16[B, T] engine log-probs (no gradient).
      advantages: f32[B, T] (no gradient).
      action_mask: bool[B, T].
      eps_low, eps_high: band half-widths, > 0 (paper: 0.3 / 5.0 for math,
        0.8 / 3.0 for coding).

    Returns:
      ``(loss f32[B, T], diagnostics)`` with ``frac_masked_low``,
      ``frac_masked_high`` (fractions of action tokens with ``r <= 1 - eps_low``
      / ``r >= 1 + eps_high``), ``mean_ratio``, ``max_abs_log_ratio``,
      ``num_action_tokens``.

    Raises:
      ValueError: on shape mismatch or non-positive concrete eps.
    """
    _check_eps(eps_low, eps_high)
    logp, log_ratio, adv, m = _prepare(logprobs, rollout_logprobs, advantages, action_mask)
    ratio = jnp.exp(log_ratio)
    low = ratio <= 1.0 - eps_low
    high = ratio >= 1.0 + eps_high
    weight = jax.lax.stop_gradient(jnp.where(low | high, 0.0, ratio))
    loss = jnp.where(m, -weight * adv * logp, 0.0)
    diag = {"frac_masked_low": masked_mean(low, m), "frac_masked_high": masked_mean(high, m),
            **_ratio_diagnostics(log_ratio, m)}
    return loss, diag


def ppo_clip_fraction(ratio, advantages, action_mask, *, eps_low: float, eps_high: float) -> Array:
    """Fraction of action tokens where the PPO clip is active (no gradient).

    Respects the advantage sign: a token counts when ``A > 0`` and
    ``r > 1 + eps_high``, or ``A < 0`` and ``r < 1 - eps_low``. Inputs f32[B, T];
    returns a f32 scalar. Raises ValueError on shape mismatch.
    """
    check_same_shape(ratio=ratio, advantages=advantages, action_mask=action_mask)
    ratio, adv = as_f32(ratio), as_f32(advantages)
    clipped = ((adv > 0) & (ratio > 1.0 + eps_high)) | ((adv < 0) & (ratio < 1.0 - eps_low))
    return masked_mean(clipped, action_mask)


def _ppo_core(ratio, adv, m, eps_low, eps_high, clip_ratio_c):
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = jnp.maximum(unclipped, clipped)
    diag = {"clip_fraction": ppo_clip_fraction(jax.lax.stop_gradient(ratio), adv, m,
                                               eps_low=eps_low, eps_high=eps_high)}
    if clip_ratio_c is not None:
        check_range("clip_ratio_c", clip_ratio_c, low=1.0, low_inclusive=False)
        capped = jnp.minimum(loss, -adv * clip_ratio_c)
        dual_active = (adv < 0) & (capped < loss)
        loss = jnp.where(adv < 0, capped, loss)
        diag["dual_clip_fraction"] = masked_mean(dual_active, m)
    return jnp.where(m, loss, 0.0), diag


def ppo_clip_loss(logprobs, old_logprobs, advantages, action_mask, *, eps_low: float = 0.2,
                  eps_high: float = 0.28, clip_ratio_c: float | None = None
                  ) -> tuple[Array, dict[str, Array]]:
    """PPO clipped surrogate with clip-higher and optional dual-clip.

    ``loss_t = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``; with dual
    clip (Ye et al. 2020) tokens with ``A < 0`` are further capped at
    ``-A * clip_ratio_c`` (``clip_ratio_c > 1``, typically 3). Arguments as in
    :func:`dis_policy_loss` with ``old_logprobs`` the behaviour policy.
    Diagnostics: ``clip_fraction`` (sign-aware, :func:`ppo_clip_fraction`),
    ``dual_clip_fraction`` (if enabled), ratio statistics.
    Raises ValueError on shape mismatch or bad concrete hyper-parameters.
    """
    _check_eps(eps_low, eps_high)
    _, log_ratio, adv, m = _prepare(logprobs, old_logprobs, advantages, action_mask)
    ratio = jnp.exp(log_ratio)
    loss, diag = _ppo_core(ratio, adv, m, eps_low, eps_high, clip_ratio_c)
    return loss, {**diag, **_ratio_diagnostics(log_ratio, m)}


def gspo_loss(logprobs, old_logprobs, advantages, action_mask, *, eps_low: float = 3e-4,
              eps_high: float = 4e-4) -> tuple[Array, dict[str, Array]]:
    """GSPO: PPO clipping on the sequence-level ratio (Zheng et al. 2025).

    ``s_i = exp(mean_{t in actions(i)} (logpi_theta - logpi_old))`` (geometric
    mean of token ratios); GSPO-token form ``s_{i,t} = sg(s_i) *
    exp(logpi_t - sg(logpi_t))`` so every action token carries gradient
    ``s_i grad logpi_t``; ``loss_t = max(-A s_{i,t}, -A clip(s_{i,t}, ...))``.
    With a per-sequence advantage and ``seq-mean-token-mean`` aggregation this
    is exactly the GSPO objective. Diagnostics: ``clip_fraction`` (fraction of
    sequences with at least one action token whose clip is active),
    ``mean_seq_ratio``, ratio statistics. Raises ValueError as
    :func:`ppo_clip_loss`.
    """
    _check_eps(eps_low, eps_high)
    logp, log_ratio, adv, m = _prepare(logprobs, old_logprobs, advantages, action_mask)
    n_tok = jnp.sum(m, axis=1)
    seq_log_ratio = jnp.sum(log_ratio, axis=1) / jnp.maximum(n_tok, 1)
    seq_ratio = jax.lax.stop_gradient(jnp.exp(seq_log_ratio))[:, None]
    token_ratio = seq_ratio * jnp.exp(logp - jax.lax.stop_gradient(logp))
    loss, diag = _ppo_core(token_ratio, adv, m, eps_low, eps_high, None)
    has_tokens = n_tok > 0
    seq_clipped = jnp.any(m & (((adv > 0) & (seq_ratio > 1 + eps_high))
                               | ((adv < 0) & (seq_ratio < 1 - eps_low))), axis=1)
    diag = {"clip_fraction": masked_mean(seq_clipped, has_tokens),
            "mean_seq_ratio": masked_mean(seq_ratio[:, 0], has_tokens),
            **_ratio_diagnostics(log_ratio, m)}
    return loss, diag


def tis_policy_loss(logprobs, old_logprobs, advantages, action_mask, *, rollout_logprobs,
                    eps_low: float = 0.2, eps_high: float = 0.28, cap: float = 2.0,
                    mode: str = "truncate", clip_ratio_c: float | None = None
                    ) -> tuple[Array, dict[str, Array]]:
    """GRPO's PPO clip corrected for the rollout/learner mismatch (TIS / MIS).

    The PPO loss against ``old_logprobs`` (learner at the step start) is
    multiplied by a stop-gradient importance weight
    ``w = pi_old / pi_rollout``: ``mode="truncate"`` (TIS) uses
    ``min(w, cap)``; ``mode="mask"`` (MIS) keeps ``w`` where ``w <= cap`` and
    0 elsewhere (those tokens get no gradient).

    Extra args: ``rollout_logprobs f32[B, T]``, ``cap > 0``. Diagnostics add
    ``mean_is_weight`` and ``frac_is_capped`` (tokens with ``w > cap``).
    Raises ValueError on shape mismatch, unknown ``mode`` or a concrete ``cap <= 0``.
    """
    if mode not in ("truncate", "mask"):
        raise ValueError(f"unknown TIS mode {mode!r}; valid: ('truncate', 'mask')")
    check_same_shape(logprobs=logprobs, rollout_logprobs=rollout_logprobs)
    check_range("cap", cap, low=0.0, low_inclusive=False)
    loss, diag = ppo_clip_loss(logprobs, old_logprobs, advantages, action_mask,
                               eps_low=eps_low, eps_high=eps_high, clip_ratio_c=clip_ratio_c)
    m = as_mask(action_mask)
    log_w = jnp.where(m, as_f32(old_logprobs) - as_f32(rollout_logprobs), 0.0)
    w = jax.lax.stop_gradient(jnp.exp(log_w))
    over = w > cap
    weight = jnp.minimum(w, cap) if mode == "truncate" else jnp.where(over, 0.0, w)
    loss = jnp.where(m, weight * loss, 0.0)
    diag.update(mean_is_weight=masked_mean(weight, m), frac_is_capped=masked_mean(over, m))
    return loss, diag

