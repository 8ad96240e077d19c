"""Repro arm ``m_grpo_sync``: GRPO synchronous (tau = 0, a barrier per batch), for wall-clock time to target, with the round-two mechanisms (experiments/repro/mech.py).

    python -m sao.main --config=experiments/repro/m_grpo_sync.py:SEED --workdir=RUNS/m_grpo_sync/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms m_grpo_sync``).
"""
from experiments import grpo_math
from experiments.repro import mech


def get_config(arg=None):
    return mech.mech(grpo_math.get_config("cpu"), arg, name="m_grpo_sync", tau=0)
