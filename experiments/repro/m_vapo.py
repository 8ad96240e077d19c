"""Repro arm ``m_vapo``: vanilla VAPO (critic, PPO clip, no DIS), with the round-two mechanisms (experiments/repro/mech.py).

    python -m sao.main --config=experiments/repro/m_vapo.py:SEED --workdir=RUNS/m_vapo/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms m_vapo``).
"""
from experiments import vapo_math
from experiments.repro import mech


def get_config(arg=None):
    return mech.mech(vapo_math.get_config("cpu"), arg, name="m_vapo")
