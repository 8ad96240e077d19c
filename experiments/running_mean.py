"""Single rollout with a running-mean baseline: A = R - mean(last 8 rewards of the prompt).

Commands (from the repository root)::

    python -m sao.main --config=experiments/running_mean.py:cpu --workdir=runs/running_mean_cpu
    python -m sao.main --config=experiments/running_mean.py:qwen3_30b_a3b --workdir=gs://BUCKET/running_mean
    python launch/tpu_vm.py --config=experiments/running_mean.py:qwen3_30b_a3b --dry-run

Variants: ``cpu`` (tiny byte-level model, runs on a laptop CPU) and full-scale
``qwen3_30b_a3b`` (default), ``qwen3_8b``, ``qwen3_1p7b`` (SGLang fleet).
"""
from experiments import common

VARIANTS = ("cpu",) + tuple(common.FULL_SCALE)


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS, "qwen3_30b_a3b")
    c = common.base()
    c.name = "running_mean"
    c.learner.advantage_estimator = "running_mean"  # per-prompt running-mean baseline, no critic
    c.critic.critic_steps = 0                # no critic
    c.critic.critic_warmup_steps = 0
    c.critic.value_pretrain_steps = 0
    c = common.cpu(c) if variant == "cpu" else common.full_scale(c, variant)
    return common.finalize(c)
