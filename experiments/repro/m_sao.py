"""Repro arm ``m_sao``: SAO: single rollout, critic (K=2, frozen attention, warm-up, value pretraining), DIS, with the round-two mechanisms (experiments/repro/mech.py).

    python -m sao.main --config=experiments/repro/m_sao.py:SEED --workdir=RUNS/m_sao/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms m_sao``).
"""
from experiments import sao_math
from experiments.repro import mech


def get_config(arg=None):
    return mech.mech(sao_math.get_config("cpu"), arg, name="m_sao")
