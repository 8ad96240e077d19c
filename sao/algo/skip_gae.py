"""Skip-observation GAE (docs/algorithm.md §3, paper Eq. 4-5).

GAE runs over the subsequence of action tokens only: from the last token of an
action span the recursion jumps to the first token of the next action span, so
an observation span of any length is one step. With ``next(t)`` the next
action token after t::

    delta_t = r_t + gamma * V(next(t)) - V(t)
    A_t     = delta_t + gamma * lam * A(next(t))
    R_t     = A_t + V(t)                      (critic target)

After the last action token ``V = bootstrap`` (0: terminal) and ``A = 0``.
Prompt / observation positions (``action_mask == 0``) get advantage 0 and
return 0. It is exactly classic GAE on the compacted action-token sequence.

Reward placement **[ours]**: a reward sitting on a non-action position is
moved onto the closest *preceding* action token (so tool-time or end-of-episode
rewards are never lost). A reward before the first action token of its row
(or in a row with no action token) cannot be credited to any action: it is
ignored, and :func:`relocate_rewards` returns how many such rewards each row
had so the caller can count them.

Reading order: :func:`_literal_gae` below is the recursion above written out
token by token (``gae(method="scan")``); the tests check the fast solvers
against it. After :func:`gae` come the fast solvers (``"chunked"``, the
default, and ``"associative"``), which compute the same numbers as one affine
recurrence (sao/algo/recurrence.py).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from sao.algo import recurrence
from sao.algo.checks import check_range
from sao.algo.masked import as_f32, as_mask

Array = jax.Array
GAE_METHODS = ("chunked", "associative", "scan")


def _literal_gae(r, v, m, gamma, lam, bootstrap, unroll: int = 16):
    """The recursion of the module doc, one token at a time (``method="scan"``).

    A reverse ``jax.lax.scan`` over time. Per row it carries the value and the
    advantage of the next action token and the rewards seen on non-action
    tokens since then (which the module doc moves onto this action token).
    Non-action tokens change nothing else, which is the skip.

    Args:
      r, v: f32[B, T] rewards and values; m: bool[B, T] action mask.
      gamma, lam, bootstrap: f32[B] per row (bootstrap: V after the last token).
      unroll: time steps per loop iteration (speed only).

    Returns:
      ``(advantages, returns)``, f32[B, T], zero off the mask.
    """
    def step(carry, token):
        next_value, next_advantage, pending_reward = carry
        reward, value, is_action = token
        delta = reward + pending_reward + gamma * next_value - value
        advantage = delta + gamma * lam * next_advantage
        carry = (jnp.where(is_action, value, next_value),
                 jnp.where(is_action, advantage, next_advantage),
                 jnp.where(is_action, 0.0, pending_reward + reward))
        return carry, jnp.where(is_action, advantage, 0.0)

    zeros = recurrence.typed_like(jnp.zeros_like(bootstrap), r[:, 0])
    start = (recurrence.typed_like(bootstrap, r[:, 0]), zeros, zeros)
    _, advantages = jax.lax.scan(step, start, (r.T, v.T, m.T), reverse=True, unroll=unroll)
    advantages = advantages.T
    return advantages, jnp.where(m, advantages + v, 0.0)


def gae(rewards, values, action_mask, *, gamma, lam, bootstrap_value=None,
        method: str = "chunked") -> tuple[Array, Array]:
    """Skip-observation generalised advantage estimation (paper Eq. 4-5).

    Args:
      rewards: f32/bf16[B, T] per-token rewards; off-action rewards are moved
        to the preceding action token (see module doc).
      values: f32/bf16[B, T] critic values V(t) (only action positions are
        read; others may hold anything, even NaN).
      action_mask: bool/int[B, T], true on policy-generated tokens.
      gamma: discount per action-token step, scalar in [0, 1].
      lam: GAE lambda, scalar or f32[B] (e.g. :func:`length_adaptive_lambda`).
      bootstrap_value: optional f32[B], V of the state after the last action
        token for truncated rows; None means 0 everywhere (terminal).
      method: ``"chunked"`` (default, fastest on CPU) or ``"associative"``:
        fast solvers of the same recurrence (after this function); ``"scan"``:
        the literal per-token recursion, :func:`_literal_gae` (first in this
        file), the reference the fast solvers are tested against. All three
        agree to f32 rounding.

    Returns:
      ``(advantages, returns)``, both f32[B, T], zero off the action mask;
      ``returns = advantages + values`` on action tokens (lam=1 gives
      Monte-Carlo returns).

    Raises:
      ValueError: on shape mismatch, unknown ``method``, or a concrete
        ``gamma`` / ``lam`` outside [0, 1].
    """
    if method not in GAE_METHODS:
        raise ValueError(f"unknown GAE method {method!r}; valid: {GAE_METHODS}")
    _check_inputs(rewards, values, action_mask, bootstrap_value)
    check_range("gamma", gamma, low=0.0, high=1.0)
    check_range("lam", lam, low=0.0, high=1.0)
    r, v, m = as_f32(rewards), as_f32(values), as_mask(action_mask)
    batch = r.shape[0]
    gamma_b = _row_param(gamma, batch, "gamma")
    lam_b = _row_param(lam, batch, "lam")
    if bootstrap_value is None:
        bootstrap = jnp.zeros((batch, 1), jnp.float32)
    else:
        bootstrap = as_f32(bootstrap_value)[:, None]
    if r.size == 0:  # B = 0 or T = 0: nothing to estimate
        return jnp.zeros_like(r), jnp.zeros_like(r)
    return _gae_core(r, v, m, gamma_b, lam_b, bootstrap, method)


@functools.partial(jax.jit, static_argnames="method")
def _gae_core(r, v, m, gamma, lam, bootstrap, method):
    # Jitted so that eager callers compile one program, not one per primitive.
    # gamma, lam, bootstrap: f32[B, 1].
    if method == "scan":
        return _literal_gae(r, v, m, gamma[:, 0], lam[:, 0], bootstrap[:, 0])
    # The fast solvers. The whole computation above (reward relocation and the
    # jump to the next action token's value included) is one affine
    # recurrence over *all* positions, carried backward:
    #   H_T = gamma * bootstrap
    #   H_t = H_{t+1} + r_t                                          (t not an action)
    #   H_t = gamma*lam * H_{t+1} + gamma*lam*r_t + gamma*(1-lam)*V(t)   (action)
    #   A_t = r_t - V(t) + H_{t+1}                                   (action tokens)
    # H_t is gamma*V(t') + gamma*lam*A(t') of the next action token t' at or
    # after t, plus the rewards waiting on non-action tokens before it.
    # Values off the mask may hold anything, even NaN: every use of v below is
    # inside a where() on m that discards it there (no separate masking pass).
    gl = gamma * lam
    if method == "chunked":
        return _gae_blocked(r, v, m, gamma, gl, gamma * bootstrap)
    a = jnp.where(m, gl, 1.0)
    b = jnp.where(m, gl * r + (gamma - gl) * v, r)
    h_next = recurrence.solve_associative(a, b, gamma * bootstrap)
    advantages = jnp.where(m, r - v + h_next, 0.0)
    return advantages, jnp.where(m, advantages + v, 0.0)


def _gae_blocked(r, v, m, gamma, gl, x_end):
    """``_gae_core`` with :func:`recurrence.solve_blocked`, all in the [B, n, 8] layout."""
    length = r.shape[1]
    r3, v3 = recurrence.to_blocks(r, 0.0), recurrence.to_blocks(v, 0.0)
    m3 = recurrence.to_blocks(m, False)
    operands = (r3, v3, m3, gamma, gl, x_end)
    advantages = jax.lax.platform_dependent(*operands, cpu=_advantages_materialised,
                                            default=_blocked_advantages)
    returns = jnp.where(m3, advantages + v3, 0.0)
    return recurrence.from_blocks(advantages, length), recurrence.from_blocks(returns, length)


def _blocked_advantages(r3, v3, m3, gamma, gl, x_end):
    def coeff(j):  # gamma, gl: f32[B, 1], broadcast over the blocks of a row
        m_j, r_j = m3[:, :, j], r3[:, :, j]
        return jnp.where(m_j, gl, 1.0), jnp.where(m_j, gl * r_j + (gamma - gl) * v3[:, :, j], r_j)

    h_next = recurrence.solve_blocked(coeff, x_end)
    return jnp.where(m3, r3 - v3 + h_next, 0.0)


def _advantages_materialised(*operands):
    """:func:`_blocked_advantages` behind a fusion barrier (XLA:CPU only).

    XLA:CPU has no multi-output fusion by default: it fuses the whole final
    pass of the solver into *both* consumers, the advantages output and the
    returns, computing it twice. A conditional is never fused, so running
    the same function in both branches (any predicate selects the same
    result) materialises the advantages once and the returns become a cheap
    pass over them: ~1.2x faster at B=256, T=4096 (benchmarks/README.md).
    Under ``vmap`` the predicate is batched, the conditional becomes a select
    of the two identical branches and XLA merges them: no barrier, no double
    work. On a multi-device CPU mesh the predicate costs one small collective.
    GPU/TPU compilers fuse both outputs and take the plain path.
    """
    first_reward = operands[0][0, 0, 0]  # data, so XLA cannot fold the predicate
    return jax.lax.cond(first_reward == first_reward, _blocked_advantages,
                        _blocked_advantages, *operands)


def relocate_rewards(rewards, action_mask) -> tuple[Array, Array]:
    """Moves every reward onto the closest action token at or before it.

    Args:
      rewards: f32/bf16[B, T] per-token rewards (usually one outcome reward on
        the last action token).
      action_mask: bool/int[B, T], true on policy-generated tokens.

    Returns:
      ``(relocated f32[B, T], num_unassigned i32[B])``: ``relocated`` is zero
      off the action mask and, at action token t, holds ``r_t`` plus every
      reward on the non-action positions between t and the next action token;
      ``num_unassigned`` counts nonzero rewards that precede the row's first
      action token (or sit in a row without action tokens) and are dropped.

    Raises:
      ValueError: if shapes differ or are not 2-D.
    """
    _check_inputs(rewards, rewards, action_mask, None)
    r = as_f32(rewards)
    if r.size == 0:
        return r, jnp.zeros((r.shape[0],), jnp.int32)
    return _relocate_core(r, as_mask(action_mask))


@jax.jit
def _relocate_core(r, m):
    # X_t = (1 - m_t) (r_t + X_{t+1}), X_T = 0: the rewards from t up to the
    # next action token (0 on action tokens); action t collects r_t + X_{t+1}.
    length = r.shape[1]
    r3, m3 = recurrence.to_blocks(r, 0.0), recurrence.to_blocks(m, False)

    def coeff(j):
        return jnp.where(m3[:, :, j], 0.0, 1.0), jnp.where(m3[:, :, j], 0.0, r3[:, :, j])

    x_next = recurrence.solve_blocked(coeff, jnp.zeros_like(r[:, :1]))
    relocated = recurrence.from_blocks(jnp.where(m3, r3 + x_next, 0.0), length)
    before_first = jnp.cumsum(m, axis=1) == 0
    num_unassigned = jnp.sum(before_first & (r != 0), axis=1).astype(jnp.int32)
    return relocated, num_unassigned


def length_adaptive_lambda(action_mask, alpha: float = 1.5) -> Array:
    """Length-adaptive GAE lambda (VAPO), ``lam = 1 - 1 / (alpha * l)``.

    Args:
      action_mask: bool/int[B, T]; ``l`` = number of action tokens per row
        **[ours: l counts action tokens]**.
      alpha: positive scale (paper 1.5).

    Returns:
      f32[B] in [0, 1). Rows with ``alpha * l <= 1`` (including ``l = 0``)
      get 0 (one-step TD) rather than a negative or infinite lambda.

    Raises:
      ValueError: if ``action_mask`` is not 2-D or a concrete ``alpha <= 0``.
    """
    if jnp.ndim(action_mask) != 2:
        raise ValueError(f"action_mask must be [B, T], got shape {jnp.shape(action_mask)}")
    check_range("alpha", alpha, low=0.0, low_inclusive=False)
    length = jnp.sum(as_mask(action_mask), axis=1).astype(jnp.float32)
    scaled = as_f32(alpha) * length
    return jnp.where(scaled > 1.0, 1.0 - 1.0 / jnp.maximum(scaled, 1.0), 0.0)


def _check_inputs(rewards, values, action_mask, bootstrap_value):
    shapes = {"rewards": jnp.shape(rewards), "values": jnp.shape(values),
              "action_mask": jnp.shape(action_mask)}
    if len(set(shapes.values())) != 1 or len(shapes["rewards"]) != 2:
        raise ValueError(f"rewards, values, action_mask must share one [B, T] shape, got {shapes}")
    batch = shapes["rewards"][0]
    if bootstrap_value is not None and jnp.shape(bootstrap_value) != (batch,):
        raise ValueError(f"bootstrap_value must be f32[B]=({batch},), "
                         f"got {jnp.shape(bootstrap_value)}")


def _row_param(x, batch: int, name: str) -> Array:
    """Scalar or f32[B] parameter as f32[B, 1]."""
    x = as_f32(x)
    if x.ndim == 0:
        return jnp.broadcast_to(x, (batch, 1))
    if x.shape != (batch,):
        raise ValueError(f"{name} must be a scalar or f32[B]=({batch},), got shape {x.shape}")
    return x[:, None]
