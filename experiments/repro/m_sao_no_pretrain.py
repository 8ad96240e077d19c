"""Repro arm ``m_sao_no_pretrain``: SAO without value pretraining, with the round-two mechanisms (experiments/repro/mech.py).

    python -m sao.main --config=experiments/repro/m_sao_no_pretrain.py:SEED --workdir=RUNS/m_sao_no_pretrain/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms m_sao_no_pretrain``).
"""
from experiments import sao_math
from experiments.repro import mech


def get_config(arg=None):
    c = mech.mech(sao_math.get_config("cpu"), arg, name="m_sao_no_pretrain")
    c.critic.value_pretrain_steps = 0       # the critic starts from its init (+ warm-up steps)
    return c
