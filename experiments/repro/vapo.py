"""Repro arm ``vapo``: Vanilla VAPO: PPO clip-higher (no DIS), length-adaptive GAE, value pretraining, K=1, full critic.

    python -m sao.main --config=experiments/repro/vapo.py:SEED --workdir=RUNS/vapo/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms vapo``, which
shares the seed's SFT warm start). Shared scale: experiments/repro/base.py.
"""
from experiments import vapo_math
from experiments.repro import base


def get_config(arg=None):
    return base.repro(vapo_math.get_config("cpu"), arg, name="vapo")
