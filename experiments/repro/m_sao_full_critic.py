"""Repro arm ``m_sao_full_critic``: SAO with a full-parameter critic (attention not frozen), with the round-two mechanisms (experiments/repro/mech.py).

    python -m sao.main --config=experiments/repro/m_sao_full_critic.py:SEED --workdir=RUNS/m_sao_full_critic/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms m_sao_full_critic``).
"""
from experiments import sao_full_critic
from experiments.repro import mech


def get_config(arg=None):
    return mech.mech(sao_full_critic.get_config("cpu"), arg, name="m_sao_full_critic")
