"""Repro arm ``m_grpo_dis``: GRPO with DIS, with the round-two mechanisms (experiments/repro/mech.py).

    python -m sao.main --config=experiments/repro/m_grpo_dis.py:SEED --workdir=RUNS/m_grpo_dis/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms m_grpo_dis``).
"""
from experiments import grpo_dis_math
from experiments.repro import mech


def get_config(arg=None):
    return mech.mech(grpo_dis_math.get_config("cpu"), arg, name="m_grpo_dis")
