"""Pure SAO kernels: advantages, policy/value losses, KL, aggregation, metrics.

Functions of arrays only (no config objects, no devices, no I/O), ``[B, T]``
layouts, float32 arithmetic, jit-compatible (string options are static).
See docs/algo.md.
"""
from sao.algo.aggregate import AGGREGATION_MODES, aggregate
from sao.algo.masked import (explained_variance, masked_mean, masked_sum, masked_var,
                             masked_whiten)
from sao.algo.outcome import (RunningMeanState, broadcast_to_actions, dr_grpo_advantages,
                              grpo_advantages, reinforce_pp_advantages, rloo_advantages,
                              running_mean_advantages)
from sao.algo.policy_losses import (dis_policy_loss, gspo_loss, ppo_clip_fraction,
                                    ppo_clip_loss, tis_policy_loss)
from sao.algo.registry import (ADVANTAGE_ESTIMATORS, ADVANTAGE_KINDS, POLICY_LOSSES,
                               get_advantage_estimator, get_policy_loss)
from sao.algo.regularizers import KL_ESTIMATORS, entropy_from_logits, kl_penalty, value_loss
from sao.algo.skip_gae import GAE_METHODS, gae, length_adaptive_lambda, relocate_rewards

__all__ = [
    "ADVANTAGE_ESTIMATORS", "ADVANTAGE_KINDS", "AGGREGATION_MODES", "GAE_METHODS",
    "KL_ESTIMATORS", "POLICY_LOSSES", "RunningMeanState", "aggregate", "broadcast_to_actions",
    "dis_policy_loss", "dr_grpo_advantages", "entropy_from_logits", "explained_variance",
    "gae", "get_advantage_estimator", "get_policy_loss", "grpo_advantages", "gspo_loss",
    "kl_penalty", "length_adaptive_lambda", "masked_mean", "masked_sum", "masked_var",
    "masked_whiten", "ppo_clip_fraction", "ppo_clip_loss", "reinforce_pp_advantages",
    "relocate_rewards", "rloo_advantages", "running_mean_advantages", "tis_policy_loss",
    "value_loss",
]
