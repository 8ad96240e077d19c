"""Per-token quantities of trajectories, as the learner computes them for a batch.

`token_tables` puts trajectories through the learner's own path: they are padded
with ``make_train_batch`` into the learner's ``[B, T]`` shapes; the values come
from ``Learner.critic_values``, the log-probs from ``Learner.actor_logprobs`` (at
the sampling temperature), the advantages and returns from
``sao.learner.gae_targets`` with the learner's γ, λ (length-adaptive unless
``lam_policy`` fixes it), λ_critic, whitening and truncation settings
(docs/algorithm.md §3), or from ``sao.learner.outcome_targets`` for a
critic-free estimator (GRPO, RLOO, ...). The DIS weight of each token is read
off ``sao.algo.dis_policy_loss`` itself (docs/algorithm.md §4), so the table
says exactly which tokens that loss gives no gradient.

The numbers are those the learner would use if these trajectories made up the
next batch after ``states``: one critic pass before that step's critic
updates, as in ``Learner.update``. Whitening (``whiten_advantages``, off by
default) uses the statistics of the viewed trajectories, not of a training batch.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sao import algo
from sao.learner import gae_targets, make_train_batch, outcome_targets
from sao.types import Trajectory

SPAN_KINDS = ("prompt", "action", "observation")


def token_spans(action_mask) -> list[tuple[str, int, int]]:
    """Maximal runs of one kind of token: ``[(kind, start, stop), ...]`` in order.

    ``kind`` is ``"action"`` on tokens the policy sampled, ``"prompt"`` on the
    non-action tokens before the first action token, and ``"observation"`` on
    every later run of non-action tokens (what the environment inserted: tool
    output with its frame; docs/algorithm.md §2). ``stop`` is exclusive.

    Args:
      action_mask: bool[T].
    Raises:
      ValueError: ``action_mask`` is not 1-D.
    """
    mask = np.asarray(action_mask, bool)
    if mask.ndim != 1:
        raise ValueError(f"action_mask must be [T], got shape {mask.shape}")
    spans, start, seen_action = [], 0, False
    for t in range(1, mask.size + 1):
        if t < mask.size and mask[t] == mask[start]:
            continue
        kind = "action" if mask[start] else ("observation" if seen_action else "prompt")
        seen_action |= bool(mask[start])
        spans.append((kind, start, t))
        start = t
    return spans


def dis_weights(logprobs, rollout_logprobs, policy_mask, *, eps_low: float,
                eps_high: float) -> np.ndarray:
    """``sg(f(r_t))`` of `sao.algo.dis_policy_loss` per token: ``r_t`` inside the
    open band ``(1 - eps_low, 1 + eps_high)``, 0 outside it and off the mask.

    Read off the kernel: with advantages ``-1`` its per-token loss is
    ``sg(f(r_t)) · log π_θ(t)``, so the derivative with respect to ``logprobs``
    is the weight (a token gets no gradient exactly where it is 0).

    Args:
      logprobs, rollout_logprobs: f32[B, T] learner and engine log-probs.
      policy_mask: bool[B, T] tokens that enter the policy loss.
      eps_low, eps_high: the band (paper: 0.3 / 5.0 for math).
    Returns:
      f32[B, T] numpy array.
    Raises:
      ValueError: shapes differ or a band edge is out of range (from the kernel).
    """
    rollout = jnp.asarray(rollout_logprobs, jnp.float32)
    mask = jnp.asarray(policy_mask, bool)

    def total(lp):
        loss, _ = algo.dis_policy_loss(lp, rollout, -jnp.ones_like(lp), mask,
                                       eps_low=eps_low, eps_high=eps_high)
        return jnp.sum(loss)
    return np.asarray(jax.grad(total)(jnp.asarray(logprobs, jnp.float32)))


@dataclasses.dataclass(frozen=True)
class TokenTable:
    """One trajectory's per-token quantities (`token_tables`).

    Attributes:
      trajectory: the `sao.types.Trajectory` they describe.
      columns: ``{name: array[L]}`` with ``L = trajectory.length``:
        ``position`` i32, ``tokens`` i32, ``span`` str (`token_spans` kind),
        ``span_index`` i32 (index of the span in `spans`), ``action_mask`` bool,
        ``policy_mask`` bool (action tokens that enter the policy loss: minus a
        truncated row with ``truncation="drop"``), ``policy_version`` i32,
        ``staleness`` i32 (learner version minus ``policy_version`` on action
        tokens, 0 elsewhere), ``rewards`` f32 (the outcome reward on the last
        action token), ``values`` f32 (critic V(t) at every position; the
        learner reads it on action tokens only; NaN without a critic),
        ``advantages`` f32 (0 off the action mask), ``returns`` f32 (critic
        targets, 0 off the action mask; NaN without a critic), ``logprobs`` f32
        (learner log π_θ), ``rollout_logprobs`` f32, ``ratio`` f32
        (``exp(logprobs - rollout_logprobs)`` on action tokens, NaN elsewhere),
        ``dis_weight`` f32 (`dis_weights`), ``dis_masked_low`` /
        ``dis_masked_high`` bool (policy tokens DIS gives no gradient, with
        ``ratio <= 1 - eps_low`` / ``ratio >= 1 + eps_high``).
      spans: `token_spans` of the trajectory.
      learner_version: policy version of the states the table was computed with.
      eps_low, eps_high: the DIS band used.
    """

    trajectory: Trajectory
    columns: dict[str, np.ndarray]
    spans: list[tuple[str, int, int]]
    learner_version: int
    eps_low: float
    eps_high: float

    def __len__(self) -> int:
        return self.trajectory.length

    @property
    def num_dis_masked(self) -> int:
        """Policy tokens outside the DIS band (low and high)."""
        return int(self.columns["dis_masked_low"].sum() + self.columns["dis_masked_high"].sum())

    @property
    def num_observation_tokens(self) -> int:
        """Tokens in observation spans (tool output and its frame)."""
        return sum(stop - start for kind, start, stop in self.spans if kind == "observation")

    def to_dataframe(self, tokenizer=None):
        """The columns as a pandas DataFrame, one row per token, plus
        ``trajectory_id`` and, with a ``tokenizer``, ``text`` (`token_texts`).
        pandas is the ``notebooks`` / ``test`` extra, imported here only."""
        import pandas as pd
        df = pd.DataFrame(self.columns)
        df.insert(0, "trajectory_id", self.trajectory.trajectory_id)
        if tokenizer is not None:
            df.insert(3, "text", token_texts(self.columns["tokens"], tokenizer))
        return df


def token_texts(tokens, tokenizer) -> list[str]:
    """``tokenizer.decode([id])`` of each id, special tokens included (a
    character split over several byte-level tokens shows as U+FFFD)."""
    return [tokenizer.decode([int(t)]) for t in np.asarray(tokens).reshape(-1)]


def token_tables(learner, states, trajectories: Sequence[Trajectory], *,
                 eps_low: float | None = None, eps_high: float | None = None,
                 seq_advantages=None) -> list[TokenTable]:
    """Per-token values, advantages, returns, DIS ratios and masks (module doc).

    Args:
      learner: a ``sao.learner.Learner``; its config gives the batch size,
        length buckets, pad id, γ, λ, estimator and DIS band.
      states: its ``LearnerStates`` (not donated: usable afterwards).
      trajectories: one or more; processed ``learner.cfg.batch_size`` at a time.
      eps_low, eps_high: DIS band; default the learner's (its trained band
        when ``policy_loss="sao_dis"``).
      seq_advantages: f32[len(trajectories)] per-trajectory advantages, needed
        exactly with ``advantage_estimator="given"`` (e.g. a running mean).
    Returns:
      one `TokenTable` per trajectory, in order.
    Raises:
      ValueError: no trajectories; ``seq_advantages`` given without the
        ``given`` estimator, missing with it, or of another length; a
        trajectory longer than the largest length bucket (`make_train_batch`).
    """
    cfg = learner.cfg
    if not trajectories:
        raise ValueError("token_tables needs at least one trajectory")
    if (seq_advantages is not None) != (cfg.advantage_estimator == "given"):
        raise ValueError("seq_advantages must be given exactly when advantage_estimator='given' "
                         f"(it is {cfg.advantage_estimator!r})")
    if seq_advantages is not None:
        seq_advantages = np.asarray(seq_advantages, np.float32)
        if seq_advantages.shape != (len(trajectories),):
            raise ValueError(f"seq_advantages must be f32[{len(trajectories)}], "
                             f"got shape {seq_advantages.shape}")
    eps_low = cfg.eps_low if eps_low is None else float(eps_low)
    eps_high = cfg.eps_high if eps_high is None else float(eps_high)
    version = int(states.policy_version)
    tables = []
    for lo in range(0, len(trajectories), cfg.batch_size):
        chunk = list(trajectories[lo:lo + cfg.batch_size])
        seq = None
        if seq_advantages is not None:
            seq = np.zeros(cfg.batch_size, np.float32)
            seq[:len(chunk)] = seq_advantages[lo:lo + len(chunk)]
        cols = _batch_columns(learner, states, chunk, seq, eps_low, eps_high, version)
        for i, traj in enumerate(chunk):
            spans = token_spans(traj.action_mask)
            row = {k: v[i, :traj.length] for k, v in cols.items()}
            kinds = np.empty(traj.length, dtype=f"<U{max(map(len, SPAN_KINDS))}")
            index = np.empty(traj.length, np.int32)
            for j, (kind, start, stop) in enumerate(spans):
                kinds[start:stop], index[start:stop] = kind, j
            columns = {"position": np.arange(traj.length, dtype=np.int32),
                       "tokens": row.pop("tokens"), "span": kinds, "span_index": index, **row}
            tables.append(TokenTable(traj, columns, spans, version, eps_low, eps_high))
    return tables


def _batch_columns(learner, states, chunk, seq, eps_low, eps_high, version) -> dict:
    """Host f32/i32/bool ``[B, T]`` columns of one padded batch."""
    cfg = learner.cfg
    batch = make_train_batch(chunk, buckets=cfg.length_buckets, batch_size=cfg.batch_size,
                             pad_id=cfg.pad_id)
    placed = learner.put_batch(batch)
    logprobs = np.asarray(jax.device_get(learner.actor_logprobs(states, placed.tokens)))
    targets = dict(whiten=cfg.whiten_advantages, drop_truncated=cfg.truncation == "drop")
    nan = np.full(batch.tokens.shape, np.nan, np.float32)
    values = returns = nan
    if cfg.uses_critic:
        values_dev = learner.critic_values(states, placed.tokens)
        with jax.set_mesh(learner.mesh):
            t = gae_targets(placed, values_dev, states.actor.step, gamma=cfg.gamma,
                            alpha=cfg.alpha, lam_policy=cfg.lam_policy,
                            lam_critic=cfg.lam_critic, **targets)
        values = np.asarray(jax.device_get(values_dev))
        returns = np.asarray(jax.device_get(t["returns"]))
    else:
        with jax.set_mesh(learner.mesh):
            t = outcome_targets(placed, states.actor.step, seq, estimator=cfg.advantage_estimator,
                                gamma=cfg.gamma, **targets)
    action = np.asarray(jax.device_get(t["action_mask"]))
    policy = np.asarray(jax.device_get(t["policy_mask"]))
    rollout = batch.rollout_logprobs
    weight = np.where(policy, dis_weights(logprobs, rollout, policy, eps_low=eps_low,
                                          eps_high=eps_high), 0.0).astype(np.float32)
    ratio = np.where(action, np.exp(np.where(action, logprobs - rollout, 0.0)), np.nan)
    dropped = policy & (weight == 0.0)
    return {"tokens": batch.tokens, "action_mask": action, "policy_mask": policy,
            "policy_version": batch.policy_version,
            "staleness": np.where(action, version - batch.policy_version, 0).astype(np.int32),
            "rewards": batch.rewards, "values": values,
            "advantages": np.asarray(jax.device_get(t["advantages"])), "returns": returns,
            "logprobs": logprobs, "rollout_logprobs": rollout,
            "ratio": ratio.astype(np.float32), "dis_weight": weight,
            "dis_masked_low": dropped & (ratio < 1.0), "dis_masked_high": dropped & (ratio > 1.0)}
