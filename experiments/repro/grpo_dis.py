"""Repro arm ``grpo_dis``: GRPO advantages (4 prompts x 8 rollouts) with the DIS loss.

    python -m sao.main --config=experiments/repro/grpo_dis.py:SEED --workdir=RUNS/grpo_dis/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms grpo_dis``, which
shares the seed's SFT warm start). Shared scale: experiments/repro/base.py.
"""
from experiments import grpo_dis_math
from experiments.repro import base


def get_config(arg=None):
    return base.repro(grpo_dis_math.get_config("cpu"), arg, name="grpo_dis")
