"""SAO with DIS only: single rollout + critic, without the value-model designs of section 5.

Commands (from the repository root)::

    python -m sao.main --config=experiments/sao_dis_only.py:cpu --workdir=runs/sao_dis_only_cpu
    python -m sao.main --config=experiments/sao_dis_only.py:qwen3_30b_a3b --workdir=gs://BUCKET/sao_dis_only
    python launch/tpu_vm.py --config=experiments/sao_dis_only.py:qwen3_30b_a3b --dry-run

Variants: ``cpu`` (tiny byte-level model, runs on a laptop CPU) and full-scale
``qwen3_30b_a3b`` (default), ``qwen3_8b``, ``qwen3_1p7b`` (SGLang fleet).
"""
from experiments import common

VARIANTS = ("cpu",) + tuple(common.FULL_SCALE)


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS, "qwen3_30b_a3b")
    c = common.base()
    c.name = "sao_dis_only"
    c = common.cpu(c) if variant == "cpu" else common.full_scale(c, variant)
    # After cpu(), which sets a critic warm-up and value pretraining for SAO.
    c.critic.critic_steps = 1                # one critic step per policy step
    c.critic.critic_warmup_steps = 0         # no critic warm-up
    c.critic.critic_freeze_regex = ""        # full-parameter critic
    c.critic.value_pretrain_steps = 0        # no value pretraining
    return common.finalize(c)
