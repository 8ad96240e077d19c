"""Repro arm ``drift_running_mean``: simulated online learning with the global running-mean baseline (last 128 rewards).

    python -m sao.main --config=experiments/repro/drift_running_mean.py:SEED --workdir=RUNS/drift_running_mean/seedSEED

Shared scale: experiments/repro/base.py; the drift env of experiments/online_drift.py.
"""
from experiments import online_drift
from experiments.repro import base


def get_config(arg=None):
    c = base.repro(online_drift.get_config("cpu_running_mean"), arg, name="drift_running_mean")
    c.env.drift_schedule = base.DRIFT_SWITCHES
    return c
