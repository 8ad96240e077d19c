"""Value-model ablation: SAO with K=1 critic update per policy update.

Commands (from the repository root)::

    python -m sao.main --config=experiments/sao_k1.py:cpu --workdir=runs/sao_k1_cpu
    python -m sao.main --config=experiments/sao_k1.py:qwen3_30b_a3b --workdir=gs://BUCKET/sao_k1
    python launch/tpu_vm.py --config=experiments/sao_k1.py:qwen3_30b_a3b --dry-run

Variants: ``cpu`` (tiny byte-level model, runs on a laptop CPU) and full-scale
``qwen3_30b_a3b`` (default), ``qwen3_8b``, ``qwen3_1p7b`` (SGLang fleet).
"""
from experiments import common

VARIANTS = ("cpu",) + tuple(common.FULL_SCALE)


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS, "qwen3_30b_a3b")
    c = common.base()
    c.name = "sao_k1"
    c.critic.critic_steps = 1                # K = 1 instead of 2
    c = common.cpu(c) if variant == "cpu" else common.full_scale(c, variant)
    return common.finalize(c)
