"""Repro arm ``m_drift_running_mean``: online drift (cpu_running_mean), the rewarded answer style switches every
``mech.DRIFT_PHASE`` steps after a warm start that demonstrates every style (experiments/repro/mech.py).

    python -m sao.main --config=experiments/repro/m_drift_running_mean.py:SEED --workdir=RUNS/m_drift_running_mean/seedSEED

Its SFT differs from the other arms' (``sft.style_mix``): the sweep trains it once per
seed for both drift arms (``experiments.repro.SFT_OF``, ``RUNS/_sft_m_drift_sao/seedS``).
"""
from experiments import online_drift
from experiments.repro import mech


def get_config(arg=None):
    return mech.drift(online_drift.get_config("cpu_running_mean"), arg, name="m_drift_running_mean")
