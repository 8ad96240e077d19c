"""Repro arm ``sao_k1``: SAO with K=1 critic update per policy update (vs K=2 in ``sao``).

    python -m sao.main --config=experiments/repro/sao_k1.py:SEED --workdir=RUNS/sao_k1/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms sao_k1``, which
shares the seed's SFT warm start). Shared scale: experiments/repro/base.py.
"""
from experiments import sao_k1
from experiments.repro import base


def get_config(arg=None):
    return base.repro(sao_k1.get_config("cpu"), arg, name="sao_k1")
