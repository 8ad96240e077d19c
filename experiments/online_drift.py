"""Simulated online learning: the rewarded answer style switches during training (paper section 8).

Reward = correctness x style, both binary, judged by a rule-based judge (an
OpenAI-compatible judge endpoint is an option of ``sao.envs``). The style
switches at steps 150 and 300 (``env.drift_schedule``); SAO's critic should
re-adapt faster than the running-mean baseline (last 128 rewards overall).

Commands (from the repository root)::

    python -m sao.main --config=experiments/online_drift.py:cpu --workdir=runs/online_cpu
    python -m sao.main --config=experiments/online_drift.py:cpu_running_mean --workdir=runs/online_rm_cpu
    python -m sao.main --config=experiments/online_drift.py:qwen3_8b --workdir=gs://BUCKET/online

Variants: ``cpu`` / ``cpu_running_mean`` (tiny model, switches at steps 10 and
20) and full-scale ``qwen3_8b`` (default) / ``qwen3_8b_running_mean``,
``qwen3_30b_a3b``.
"""
from experiments import common

VARIANTS = ("cpu", "cpu_running_mean", "qwen3_8b", "qwen3_8b_running_mean", "qwen3_30b_a3b")


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS, "qwen3_8b")
    c = common.base()
    c.name = "online_drift"
    if variant.endswith("running_mean"):
        c.name = "online_drift_running_mean"
        c.learner.advantage_estimator = "running_mean"
        c.train.running_mean_window = 128    # online: last 128 rewards overall
        c.train.running_mean_scope = "global"
        c.critic.critic_steps = 0
        c.critic.critic_warmup_steps = 0
        c.critic.value_pretrain_steps = 0
    if variant.startswith("cpu"):
        c = common.cpu(c)
        c.env.drift_schedule = (10, 20)      # learner steps where the preferred style switches
        c.run.steps = 30                     # three style phases of 10 steps
    else:
        c = common.full_scale(c, variant.replace("_running_mean", ""))
        c.env.drift_schedule = (150, 300)
        c.run.steps = 450                    # three style phases of 150 steps
    c.env.tasks = ("drift/basic_arithmetic",)   # arithmetic graded x answer style, style drifts
    return common.finalize(c)
