"""GRPO advantages with the DIS loss on repository tasks: the baseline twin of ``sao_swe``.

Commands (from the repository root)::

    python -m sao.main --config=experiments/grpo_dis_swe.py:cpu --workdir=runs/grpo_dis_swe_cpu
    python -m sao.main --config=experiments/grpo_dis_swe.py:qwen3_30b_a3b --workdir=gs://BUCKET/grpo_dis_swe

Everything as ``experiments/sao_swe.py`` (harness, tasks, coding DIS band,
turns, context) except the advantages: G rollouts per prompt, group-normalised
outcome advantages, no critic. Variants as ``sao_swe``: ``cpu``,
``cpu_long``, ``smollm2_cpu``, ``qwen3_30b_a3b`` (default), ``qwen3_8b``, ``qwen3_1p7b``.
"""
from experiments import common, sao_swe

VARIANTS = sao_swe.VARIANTS


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS, "qwen3_30b_a3b")
    c = common.base()
    c.name = "grpo_dis_swe"
    c.learner.advantage_estimator = "grpo"   # group-normalised outcome advantage
    c.learner.policy_loss = "sao_dis"        # DIS against the engine's log-probs
    c.critic.critic_steps = 0                # no critic
    c.critic.critic_warmup_steps = 0
    c.critic.value_pretrain_steps = 0
    c = sao_swe.swe(c, variant)
    c.critic.critic_warmup_steps = 0
    c.critic.value_pretrain_steps = 0
    c.rollout.group_size = 4 if variant in ("cpu", "cpu_long", "smollm2_cpu") else 8
    if variant == "smollm2_cpu":
        c.learner.batch_size = 4             # one group of 4 per step
    return common.finalize(c)
