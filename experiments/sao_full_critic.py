"""Value-model ablation: SAO with a full-parameter critic (attention not frozen).

Commands (from the repository root)::

    python -m sao.main --config=experiments/sao_full_critic.py:cpu --workdir=runs/sao_full_critic_cpu
    python -m sao.main --config=experiments/sao_full_critic.py:qwen3_30b_a3b --workdir=gs://BUCKET/sao_full_critic
    python launch/tpu_vm.py --config=experiments/sao_full_critic.py:qwen3_30b_a3b --dry-run

Variants: ``cpu`` (tiny byte-level model, runs on a laptop CPU) and full-scale
``qwen3_30b_a3b`` (default), ``qwen3_8b``, ``qwen3_1p7b`` (SGLang fleet).
"""
from experiments import common

VARIANTS = ("cpu",) + tuple(common.FULL_SCALE)


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS, "qwen3_30b_a3b")
    c = common.base()
    c.name = "sao_full_critic"
    c.critic.critic_freeze_regex = ""        # every critic parameter trains
    c = common.cpu(c) if variant == "cpu" else common.full_scale(c, variant)
    return common.finalize(c)
