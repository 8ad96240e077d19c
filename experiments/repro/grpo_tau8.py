"""Repro arm ``grpo_tau8``: GRPO (PPO clip-higher, no DIS) at tau=8.

    python -m sao.main --config=experiments/repro/grpo_tau8.py:SEED --workdir=RUNS/grpo_tau8/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms grpo_tau8``, which
shares the seed's SFT warm start). Shared scale: experiments/repro/base.py.
"""
from experiments import grpo_math
from experiments.repro import base


def get_config(arg=None):
    return base.repro(grpo_math.get_config("cpu"), arg, name="grpo_tau8", tau=8)
