"""The pre-registered claims as code: endpoints, pairs, directions; verdicts from the rule.

``PREREGISTRATION.md`` (this directory) is the prose; this module is what
the report runs, so that no verdict word is written by hand. Each
:class:`Claim` compares ``arm`` with ``ref`` seed by seed (arms of a seed
share its SFT warm start and held-out prompts) on one endpoint, in one
direction; ``margin`` > 0 makes it a non-inferiority claim (``arm`` is not
worse than ``ref`` by more than ``margin``: the differences are shifted by
``margin`` before the rule). ``results.verdict`` applies the rule.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np

from experiments.repro import results

NOT_RECOVERED = "censored"     # a drift run that never recovered counts the whole phase


@dataclasses.dataclass(frozen=True)
class Claim:
    id: str
    text: str               # the paper's claim, as tested here
    arm: str
    ref: str
    endpoint: str           # a key of ENDPOINTS
    direction: int          # +1: arm - ref > 0 is the claim; -1: < 0
    margin: float = 0.0     # non-inferiority margin (endpoint units); 0: superiority


def _auc(r):
    return r.auc()


def _final(r):
    return r.summary.get("accuracy_after") if r.summary else None


def _collapsed(r):
    return None if not r.evals() else float(r.collapse_step() is not None)


def _ev_first(r):
    return r.mean_of("critic/explained_variance", first=10)


def _ev_last(r):
    return r.mean_of("critic/explained_variance", last=10)


def _heldout_ev(r):
    return r.mean_of("eval/explained_variance")


def _grad(r):
    return r.mean_of("critic/grad_norm")


@functools.lru_cache(maxsize=None)
def _drift_env(arm: str):
    from experiments.repro import sweep
    return sweep.arm_config(arm, 0, []).env            # drift settings: the same for every seed


def _recovery(r):
    """Versions to recover after the first switch; a run that did not recover within the
    phase counts the phase's length (censored: favours neither arm)."""
    from sao.envs.drift import drift_summary
    env = _drift_env(r.arm)
    s = drift_summary(r.rl, tuple(env.drift_schedule), recovery_fraction=env.drift_recovery_fraction,
                      window=env.drift_recovery_window)
    if s["levels"][0] is None:
        return None                                  # nothing to recover
    lag = s["adaptation_lag"][0]
    sw = tuple(env.drift_schedule)
    end = sw[1] if len(sw) > 1 else results.actor_updates(r.arm)
    return float(lag) if lag is not None else float(end - sw[0])


ENDPOINTS: dict[str, tuple[str, Callable]] = {
    "auc": ("area under the held-out learning curve (mean pass@1 over actor updates 0..STEPS)", _auc),
    "final": ("final held-out pass@1", _final),
    "collapsed": ("collapsed (1) or not (0)", _collapsed),
    "ev_first": ("critic explained variance, first 10 steps", _ev_first),
    "ev_last": ("critic explained variance, last 10 steps", _ev_last),
    "heldout_ev": ("critic explained variance on the fixed held-out episodes (sao.value_eval), "
                   "mean over the evaluations after RL starts", _heldout_ev),
    "critic_grad_norm": ("critic gradient norm, mean over steps", _grad),
    "time_to_target": ("RL seconds to the target pass@1", None),   # needs the pair's target
    "recovery": ("policy versions to recover after the first reward switch", _recovery),
}

CLAIMS = (
    Claim("1a", "SAO beats GRPO + DIS", "m_sao", "m_grpo_dis", "auc", +1),
    Claim("1b", "GRPO + DIS beats GRPO", "m_grpo_dis", "m_grpo", "auc", +1),
    Claim("1c", "SAO beats GRPO", "m_sao", "m_grpo", "auc", +1),
    Claim("1d", "SAO beats vanilla VAPO", "m_sao", "m_vapo", "auc", +1),
    Claim("2a", "without DIS, GRPO collapses more often than GRPO + DIS", "m_grpo", "m_grpo_dis",
          "collapsed", +1),
    Claim("2b", "without DIS, VAPO collapses more often than SAO", "m_vapo", "m_sao", "collapsed",
          +1),
    Claim("3a", "K = 2 critic updates explain more variance than K = 1 (fixed held-out "
          "episodes)", "m_sao", "m_sao_k1", "heldout_ev", +1),
    Claim("3b", "a frozen-attention critic has a lower gradient norm than a full one", "m_sao",
          "m_sao_full_critic", "critic_grad_norm", -1),
    Claim("3c", "... without costing accuracy (non-inferior by 2 points of AUC)", "m_sao",
          "m_sao_full_critic", "auc", +1, margin=0.02),
    Claim("4", "value pretraining helps the critic early: SAO vs SAO without it", "m_sao",
          "m_sao_no_pretrain", "ev_first", +1),
    Claim("5", "asynchronous SAO reaches the target sooner in wall-clock than synchronous "
          "GRPO", "m_sao", "m_grpo_sync", "time_to_target", -1),
    Claim("6", "after a reward switch SAO recovers faster than the running-mean baseline",
          "m_drift_sao", "m_drift_running_mean", "recovery", -1),
)


def target_of(runs_by_arm, claim: Claim) -> float | None:
    """Claim 5's target: 90% of the lower of the two arms' mean final pass@1 (symmetric)."""
    finals = [np.mean([_final(r) for r in results.done(runs_by_arm.get(a, []))])
              for a in (claim.arm, claim.ref) if results.done(runs_by_arm.get(a, []))]
    return 0.9 * min(finals) if len(finals) == 2 else None


def endpoint_fn(runs_by_arm, claim: Claim) -> Callable:
    if claim.endpoint != "time_to_target":
        return ENDPOINTS[claim.endpoint][1]
    target = target_of(runs_by_arm, claim)

    def time_to(r):            # never reached: censored at the run's RL seconds
        if target is None:
            return None
        t = results.time_to(r, target)
        clock = r.rl_clock()
        return t if t is not None else (max(clock.values()) if len(clock) > 1 else None)
    return time_to


def evaluate(runs_by_arm, claim: Claim) -> dict:
    """``results.verdict`` of the claim's paired differences, plus ``diffs`` and ``claim``."""
    diffs = results.paired(runs_by_arm, claim.arm, claim.ref, endpoint_fn(runs_by_arm, claim))
    v = results.verdict([d + claim.margin for d in diffs] if claim.margin else diffs,
                        claim.direction)
    if claim.margin and v["mean"] is not None:      # report the unshifted differences
        v.update(mean=v["mean"] - claim.margin, low=v["low"] - claim.margin,
                 high=v["high"] - claim.margin)
    return {**v, "diffs": diffs, "claim": claim}
