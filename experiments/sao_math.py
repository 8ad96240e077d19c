"""SAO on tool-integrated math (the paper's main run, Qwen3-30B-A3B).

Commands (from the repository root)::

    python -m sao.main --config=experiments/sao_math.py:cpu --workdir=runs/sao_math_cpu
    python -m sao.main --config=experiments/sao_math.py:qwen3_30b_a3b --workdir=gs://BUCKET/sao_math
    python launch/tpu_vm.py --config=experiments/sao_math.py:qwen3_30b_a3b --dry-run

Variants: ``cpu`` (tiny byte-level model, runs on a laptop CPU) and full-scale
``qwen3_30b_a3b`` (default), ``qwen3_8b``, ``qwen3_1p7b`` (SGLang fleet).
"""
from experiments import common

VARIANTS = ("cpu",) + tuple(common.FULL_SCALE)


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS, "qwen3_30b_a3b")
    c = common.base()
    c.name = "sao_math"
    # SAO as specified: single rollout, critic, skip-observation GAE, DIS 0.3/5.0,
    # K=2, critic warm-up 10, alpha=1.5, lambda_critic=1, batch 128, LRs 1e-6 / 5e-6,
    # frozen-attention critic: every value is base()'s.
    c = common.cpu(c) if variant == "cpu" else common.full_scale(c, variant)
    return common.finalize(c)
