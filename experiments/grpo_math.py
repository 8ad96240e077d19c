"""GRPO baseline with clip-higher: 16 prompts x 8 rollouts, PPO clip (0.2, 0.28), no critic.

Commands (from the repository root)::

    python -m sao.main --config=experiments/grpo_math.py:cpu --workdir=runs/grpo_math_cpu
    python -m sao.main --config=experiments/grpo_math.py:qwen3_30b_a3b --workdir=gs://BUCKET/grpo_math
    python launch/tpu_vm.py --config=experiments/grpo_math.py:qwen3_30b_a3b --dry-run

Variants: ``cpu`` (tiny byte-level model, runs on a laptop CPU) and full-scale
``qwen3_30b_a3b`` (default), ``qwen3_8b``, ``qwen3_1p7b`` (SGLang fleet).
"""
from experiments import common

VARIANTS = ("cpu",) + tuple(common.FULL_SCALE)


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS, "qwen3_30b_a3b")
    c = common.base()
    c.name = "grpo_math"
    c.learner.advantage_estimator = "grpo"   # group-normalised outcome advantage
    c.learner.policy_loss = "ppo_clip"       # ratio vs the engine's rollout_logprobs (algorithm.md §7)
    c.learner.eps_low = 0.2                  # clip-higher: lower clip 0.2
    c.learner.eps_high = 0.28                # clip-higher: upper clip 0.28
    c.rollout.group_size = 8                 # G rollouts per prompt
    c.critic.critic_steps = 0                # no critic
    c.critic.critic_warmup_steps = 0
    c.critic.value_pretrain_steps = 0
    c = common.cpu(c) if variant == "cpu" else common.full_scale(c, variant)
    return common.finalize(c)
