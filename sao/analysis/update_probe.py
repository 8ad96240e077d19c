"""What learner updates do to the likelihood of episodes, solved and unsolved.

`update_effect` applies ``updates`` learner steps to one batch of episodes and,
after each, measures how the summed action log-prob of every episode changed:
the batch's own (what the update pushed up or down) and, if given, episodes it
was not trained on (what it did to the rest of the policy). Split by solved and
unsolved, this shows whose gradient a step is made of: docs/swe_cpu_runs.md
found with it that on the byte model's repository tasks a step is mostly the
failures' push-down, and can lower the weakest solved episodes.

Usage with a run's checkpoint (`sao.analysis.CheckpointedRun`)::

    with CheckpointedRun(cfg, "runs/x") as run:     # cfg.learner.batch_size >= 16
        states = run.restore().train_state
        states, rows = update_effect(run.learner, states, run.sample(states, 16, seed=0),
                                     held_out=run.sample(states, 16, seed=1), updates=2)
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from sao.learner.batch import make_train_batch
from sao.types import Trajectory

PREFIX = "logp_change"     # the probe's keys, apart from the learner's own metrics


def sequence_logprobs(learner, states, episodes: Sequence[Trajectory]) -> np.ndarray:
    """Summed action-token log-probs f64[N] (nats) of ``episodes`` under the actor of
    ``states``, at the learner's temperature; computed ``learner.cfg.batch_size`` rows at a
    time (the last chunk padded).

    Raises:
      ValueError: an episode longer than every ``learner.cfg.length_buckets``.
    """
    cfg, out = learner.cfg, []
    for i in range(0, len(episodes), cfg.batch_size):
        chunk = list(episodes[i:i + cfg.batch_size])
        batch = make_train_batch(chunk, buckets=cfg.length_buckets, batch_size=cfg.batch_size,
                                 pad_id=cfg.pad_id)
        out.append(_summed(learner, states, batch, len(chunk)))
    return np.concatenate(out) if out else np.zeros(0)


def _summed(learner, states, batch, n: int) -> np.ndarray:
    """Summed action log-probs f64[n] of the first ``n`` rows of a `TrainBatch`."""
    lp = np.asarray(learner.actor_logprobs(states, batch.tokens), np.float64)
    return np.where(np.asarray(batch.action_mask), lp, 0.0).sum(axis=1)[:n]


def _split(change: np.ndarray, solved: np.ndarray, group: str) -> dict[str, float]:
    def mean(x):
        return float(x.mean()) if x.size else float("nan")
    key = f"{PREFIX}/{group}"
    return {f"{key}/solved": mean(change[solved]), f"{key}/unsolved": mean(change[~solved]),
            f"{key}/solved_min": float(change[solved].min()) if solved.any() else float("nan")}


def update_effect(learner, states, episodes: Sequence[Trajectory], *,
                  held_out: Sequence[Trajectory] = (), updates: int = 1,
                  seq_advantages=None, solved_above: float = 0.5):
    """Applies ``updates`` learner steps on one batch and measures each step's effect.

    Args:
      learner: a `sao.learner.Learner`.
      states: its `LearnerStates` (donated, as by ``Learner.update``).
      episodes: 1..``learner.cfg.batch_size`` trajectories, the batch of every step.
      held_out: trajectories measured but not trained on (any number).
      updates: steps on the same batch, >= 1.
      seq_advantages: f32[``learner.cfg.batch_size``] per-row advantages (padding rows
        included) for ``advantage_estimator="given"``, e.g. a running-mean run.
      solved_above: an episode is solved when its reward is above this.

    Returns:
      ``(states, rows)``: the updated states and one dict per step with ``update``
      (1-based), the mean change in summed action log-prob (nats) since before the first
      step, ``logp_change/batch/solved`` and ``.../unsolved`` (NaN for an empty group),
      the lowest solved change ``.../solved_min``, the same under
      ``logp_change/held_out/`` (absent without ``held_out``), and the step's own
      metrics (``Learner.update``'s names, e.g. ``learner/actor_updated``).

    Limits: during critic warm-up (``states.step < critic_warmup_steps``) the actor
    is not updated and every change is 0 (``learner/actor_updated`` says so). Group
    estimators (``grpo``, ``dr_grpo``, ``rloo``) need several episodes of a prompt in
    ``episodes``: a prompt alone has advantage 0.

    Raises:
      ValueError: ``updates`` < 1, no episodes or more than the batch size, an episode
        (of either list) longer than every length bucket, or ``seq_advantages`` given
        or missing against the estimator (from ``Learner.update``).
    """
    cfg = learner.cfg
    if updates < 1:
        raise ValueError(f"updates must be >= 1, got {updates}")
    if not 1 <= len(episodes) <= cfg.batch_size:
        raise ValueError(f"need 1..{cfg.batch_size} episodes (the learner's batch size), "
                         f"got {len(episodes)}")
    solved = np.array([e.reward > solved_above for e in episodes])
    held_solved = np.array([e.reward > solved_above for e in held_out], bool)
    batch = learner.put_batch(make_train_batch(list(episodes), buckets=cfg.length_buckets,
                                               batch_size=cfg.batch_size, pad_id=cfg.pad_id))
    before = _summed(learner, states, batch, len(episodes))
    held_before = sequence_logprobs(learner, states, held_out)
    rows = []
    for k in range(updates):
        states, metrics = learner.update(states, batch, seq_advantages)
        row = {"update": k + 1,
               **_split(_summed(learner, states, batch, len(episodes)) - before, solved, "batch")}
        if len(held_out):
            row.update(_split(sequence_logprobs(learner, states, held_out) - held_before,
                              held_solved, "held_out"))
        rows.append({**row, **metrics})
    return states, rows
