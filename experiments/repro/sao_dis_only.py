"""Repro arm ``sao_dis_only``: SAO with DIS only: K=1, no warm-up, full-parameter critic, no value pretraining.

    python -m sao.main --config=experiments/repro/sao_dis_only.py:SEED --workdir=RUNS/sao_dis_only/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms sao_dis_only``, which
shares the seed's SFT warm start). Shared scale: experiments/repro/base.py.
"""
from experiments import sao_dis_only
from experiments.repro import base


def get_config(arg=None):
    return base.repro(sao_dis_only.get_config("cpu"), arg, name="sao_dis_only")
