"""End to end: ``python -m sao.main`` on the running-mean baseline (``experiments/running_mean.py:cpu``).

Single rollout per prompt, no critic: the RL loop's ``RunningMeanBaseline`` gives the
learner per-row advantages (``advantage_estimator="given"``); its state is checkpointed.
"""
import json
import os
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_main_support import ROOT, TINY  # noqa: E402

from sao import run_metrics  # noqa: E402
from xla_flags import cpu_devices  # noqa: E402


def _run(workdir: str, steps: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": cpu_devices(1)}
    argv = [sys.executable, "-m", "sao.main", "--config=experiments/running_mean.py:cpu",
            f"--workdir={workdir}", *TINY, "--config.eval.every=0", "--config.rollout.num_workers=1",
            "--config.rollout.max_new_tokens=16", f"--config.run.steps={steps}"]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_running_mean_cpu_two_steps():
    workdir = tempfile.mkdtemp(prefix="sao-running-mean-")
    proc = _run(workdir, 2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert summary["steps"] == 2 and summary["trajectories"] == 16
    recs = [r for r in run_metrics.read_metrics(workdir) if r["phase"] == "rl" and r["step"] > 0]
    assert [r["step"] for r in recs] == [1, 2]
    assert all(r["learner/actor_updated"] == 1.0 for r in recs)     # no critic, no warm-up
    assert recs[-1]["learner/policy_version"] == 2
    assert not any(k.startswith("critic/") for r in recs for k in r)
    # The baseline's state rides in the checkpoint's data_state: one slot per prompt, 16 rewards.
    meta = json.load(open(os.path.join(workdir, "ckpt", "2", "meta", "metadata")))
    state = meta["data_state"]["baseline"]
    assert (state["window"], state["scope"]) == (8, "prompt")
    assert len(state["slots"]) == 16 and sum(state["count"]) == 16
