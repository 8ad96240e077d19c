"""Repro arm ``drift_sao``: simulated online learning with SAO (rewarded answer style switches at ``base.DRIFT_SWITCHES``).

    python -m sao.main --config=experiments/repro/drift_sao.py:SEED --workdir=RUNS/drift_sao/seedSEED

Shared scale: experiments/repro/base.py; the drift env of experiments/online_drift.py.
"""
from experiments import online_drift
from experiments.repro import base


def get_config(arg=None):
    c = base.repro(online_drift.get_config("cpu"), arg, name="drift_sao")
    c.env.drift_schedule = base.DRIFT_SWITCHES
    return c
