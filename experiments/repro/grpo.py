"""Repro arm ``grpo``: GRPO with clip-higher PPO (0.2, 0.28), ratio against the engine's log-probs (docs/algorithm.md §7).

    python -m sao.main --config=experiments/repro/grpo.py:SEED --workdir=RUNS/grpo/seedSEED

(or ``python -m experiments.repro.sweep run --runs RUNS --arms grpo``, which
shares the seed's SFT warm start). Shared scale: experiments/repro/base.py.
"""
from experiments import grpo_math
from experiments.repro import base


def get_config(arg=None):
    return base.repro(grpo_math.get_config("cpu"), arg, name="grpo")
