"""Repro arm ``grpo_tau1``: GRPO (PPO clip-higher, no DIS) at tau=1 (``grpo`` is tau=4).

    python -m sao.main --config=experiments/repro/grpo_tau1.py:SEED --workdir=RUNS/grpo_tau1/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms grpo_tau1``, which
shares the seed's SFT warm start). Shared scale: experiments/repro/base.py.
"""
from experiments import grpo_math
from experiments.repro import base


def get_config(arg=None):
    return base.repro(grpo_math.get_config("cpu"), arg, name="grpo_tau1", tau=1)
