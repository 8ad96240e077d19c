"""Repro arm ``m_sao_k1``: SAO with K = 1 critic update per step, with the round-two mechanisms (experiments/repro/mech.py).

    python -m sao.main --config=experiments/repro/m_sao_k1.py:SEED --workdir=RUNS/m_sao_k1/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms m_sao_k1``).
"""
from experiments import sao_k1
from experiments.repro import mech


def get_config(arg=None):
    return mech.mech(sao_k1.get_config("cpu"), arg, name="m_sao_k1")
