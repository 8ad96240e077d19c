"""Repro arm ``running_mean``: Single rollout, per-prompt running-mean baseline (last 8 rewards), DIS.

    python -m sao.main --config=experiments/repro/running_mean.py:SEED --workdir=RUNS/running_mean/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms running_mean``, which
shares the seed's SFT warm start). Shared scale: experiments/repro/base.py.
"""
from experiments import running_mean
from experiments.repro import base


def get_config(arg=None):
    return base.repro(running_mean.get_config("cpu"), arg, name="running_mean")
