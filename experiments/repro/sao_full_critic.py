"""Repro arm ``sao_full_critic``: SAO with a full-parameter critic (vs frozen attention in ``sao``).

    python -m sao.main --config=experiments/repro/sao_full_critic.py:SEED --workdir=RUNS/sao_full_critic/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms sao_full_critic``, which
shares the seed's SFT warm start). Shared scale: experiments/repro/base.py.
"""
from experiments import sao_full_critic
from experiments.repro import base


def get_config(arg=None):
    return base.repro(sao_full_critic.get_config("cpu"), arg, name="sao_full_critic")
