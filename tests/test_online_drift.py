"""End to end: ``experiments/online_drift.py:cpu`` (simulated online learning, docs/algorithm.md §8).

A tiny run (short SFT so the policy answers, one rollout worker) whose style
schedule switches at policy version 1: the ``env/...`` metrics, read from the
trajectories' drift metadata, show phase 0 ("bare") first and phase 1 after.
"""
import json
import os
import subprocess
import sys

import pytest

from sao import run_metrics
from xla_flags import cpu_devices  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One worker process (less CPU contention: ~55 s on 2 cores), 40 SFT steps (most episodes answer).
TINY = ["--config.sft.steps=40", "--config.sft.warmup_steps=5", "--config.sft.lr=2e-3",
        "--config.sft.batch_size=16", "--config.sft.num_demos=640", "--config.learner.batch_size=8",
        "--config.critic.value_pretrain_steps=0", "--config.critic.critic_warmup_steps=0",
        "--config.eval.num_prompts=8", "--config.eval.every=0", "--config.env.task_size=200",
        "--config.data.heldout_fraction=0.2", "--config.rollout.num_workers=1",
        "--config.rollout.max_concurrency=8", "--config.rollout.engine_slots=8",
        "--config.checkpoint.every=100",
        "--config.run.progress=False",
        # switch after step 1; tau=1 drops version-0 trajectories from step 3 on
        "--config.env.drift_schedule=(1,)", "--config.rollout.tau=1", "--config.run.steps=3"]


@pytest.mark.slow
def test_online_drift_cpu_switches_style(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": cpu_devices(1)}
    argv = [sys.executable, "-m", "sao.main", "--config=experiments/online_drift.py:cpu",
            f"--workdir={tmp_path}", *TINY]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = {r["step"]: r for r in run_metrics.read_metrics(str(tmp_path)) if r["phase"] == "rl"}
    assert sorted(recs) == [0, 1, 2, 3]
    drift = {s: r for s, r in recs.items() if "env/phase" in r}
    assert drift, "no judged episode carried drift metadata"
    # Step 1 trains on episodes sampled and judged at policy version 0: style phase 0.
    if 1 in drift:
        assert drift[1]["env/phase"] == 0 and drift[1]["env/learner_step"] == 0
    # Step 3 (tau=1) only has episodes sampled at version >= 1: the style switched.
    assert drift[3]["env/phase_mean"] == 1.0 and drift[3]["env/learner_step"] >= 1
    for r in drift.values():
        assert 0.0 <= r["env/quality"] <= 1.0 and 0.0 <= r["env/style_ok"] <= 1.0
    # The summary reports the adaptation per switch (None: not recovered in 3 steps).
    with open(os.path.join(tmp_path, run_metrics.SUMMARY_FILE)) as f:
        summary = json.load(f)
    assert summary["drift"]["switch_steps"] == [1]
    assert len(summary["drift"]["adaptation_lag"]) == 1
    assert set(summary["drift"]["phase_reward"]) <= {"0", "1"}
