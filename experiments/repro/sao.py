"""Repro arm ``sao``: SAO: single rollout, critic (K=2, frozen attention, warm-up, value pretraining), DIS (0.3, 5.0).

    python -m sao.main --config=experiments/repro/sao.py:SEED --workdir=RUNS/sao/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms sao``, which
shares the seed's SFT warm start). Shared scale: experiments/repro/base.py.
"""
from experiments import sao_math
from experiments.repro import base


def get_config(arg=None):
    return base.repro(sao_math.get_config("cpu"), arg, name="sao")
