"""Vanilla VAPO: value-based PPO (clip-higher), length-adaptive GAE, value pretraining, no DIS.

Commands (from the repository root)::

    python -m sao.main --config=experiments/vapo_math.py:cpu --workdir=runs/vapo_math_cpu
    python -m sao.main --config=experiments/vapo_math.py:qwen3_30b_a3b --workdir=gs://BUCKET/vapo_math
    python launch/tpu_vm.py --config=experiments/vapo_math.py:qwen3_30b_a3b --dry-run

Variants: ``cpu`` (tiny byte-level model, runs on a laptop CPU) and full-scale
``qwen3_30b_a3b`` (default), ``qwen3_8b``, ``qwen3_1p7b`` (SGLang fleet).
"""
from experiments import common

VARIANTS = ("cpu",) + tuple(common.FULL_SCALE)


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS, "qwen3_30b_a3b")
    c = common.base()
    c.name = "vapo_math"
    c.learner.policy_loss = "ppo_clip"       # PPO clip against the engine's rollout_logprobs (algorithm.md §7)
    c.learner.eps_low = 0.2                  # clip-higher lower
    c.learner.eps_high = 0.28                # clip-higher upper
    c = common.cpu(c) if variant == "cpu" else common.full_scale(c, variant)
    # After cpu(), which sets SAO's critic warm-up.
    c.critic.critic_steps = 1                # one critic step per policy step
    c.critic.critic_warmup_steps = 0         # value pretraining instead of a warm-up
    c.critic.critic_freeze_regex = ""        # full-parameter critic
    return common.finalize(c)
