"""Repro arm ``sao_tau8``: SAO at staleness bound tau=8.

    python -m sao.main --config=experiments/repro/sao_tau8.py:SEED --workdir=RUNS/sao_tau8/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms sao_tau8``, which
shares the seed's SFT warm start). Shared scale: experiments/repro/base.py.
"""
from experiments import sao_math
from experiments.repro import base


def get_config(arg=None):
    return base.repro(sao_math.get_config("cpu"), arg, name="sao_tau8", tau=8)
