"""Repro arm ``m_grpo``: GRPO with clip-higher PPO, no DIS, with the round-two mechanisms (experiments/repro/mech.py).

    python -m sao.main --config=experiments/repro/m_grpo.py:SEED --workdir=RUNS/m_grpo/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms m_grpo``).
"""
from experiments import grpo_math
from experiments.repro import mech


def get_config(arg=None):
    return mech.mech(grpo_math.get_config("cpu"), arg, name="m_grpo")
