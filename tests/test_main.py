"""End to end: ``python -m sao.main`` on a tiny quick-start config, then a resumed run.

Slow (three JAX processes start: the learner and two rollout workers), so it
runs the pipeline once and checks everything on that run.
"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_main_support import ROOT, TINY, run_main, tiny_run  # noqa: E402

from sao import main as sao_main, provenance, run_metrics, timing  # noqa: E402
from sao.analysis import experiment_config, run_config  # noqa: E402


def test_config_argv_is_forwarded_to_workers():
    argv = ["--config=experiments/x.py:cpu", "--config.run.steps=3", "--config.seed", "2",
            "--workdir=w", "--role=all"]
    assert sao_main._config_argv(argv) == ["--config=experiments/x.py:cpu", "--config.run.steps=3",
                                           "--config.seed", "2"]


def test_compilation_cache_defaults_to_the_sao_cache_dir(monkeypatch, tmp_path):
    import jax
    before = jax.config.jax_compilation_cache_dir
    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    try:
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "")          # set, even empty: left alone
        monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")   # likewise
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        assert sao_main._use_compilation_cache() == ""
        assert jax.config.jax_compilation_cache_dir == before
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0
        monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
        monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
        monkeypatch.setenv("SAO_CACHE_DIR", str(tmp_path))
        assert sao_main._use_compilation_cache() == str(tmp_path / "jax")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "jax")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0   # every program
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)


@pytest.mark.slow
def test_tiny_run_end_to_end_and_resume():
    workdir, proc = tiny_run()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    for key in ("accuracy_before", "accuracy_after", "tool_use_before", "tool_use_after",
                "steps", "trajectories", "dropped", "wall_s"):
        assert key in summary, key
    assert summary["steps"] == 2 and summary["trajectories"] == 16
    assert 0.0 <= summary["accuracy_after"] <= 1.0
    assert "SAO run summary" in proc.stdout
    # Where the time went: every phase and RL part timed; the phases make up the wall time and
    # the RL parts fit in the RL phase (each rounded to 0.1 s).
    for key in [f"time/{p}_s" for p in timing.PHASES] + [f"time/rl/{p}_s" for p in timing.RL_PARTS]:
        assert summary[key] >= 0.0 and 0.0 <= summary[key[:-2] + "_frac"] <= 1.0, key
        assert summary[key[:-2] + "_cpu_s"] >= 0.0, key
    assert summary["time/sft_cpu_s"] > 0 and summary["time/rl/update_cpu_s"] > 0
    assert summary["time/sft_s"] > 0 and summary["time/rl/update_s"] > 0
    assert summary["time/rl/wait_fleet_s"] > 0
    phases = sum(summary[f"time/{p}_s"] for p in timing.PHASES)
    assert abs(phases - summary["wall_s"]) <= 0.05 * (len(timing.PHASES) + 1)
    rl_parts = sum(summary[f"time/rl/{p}_s"] for p in timing.RL_PARTS)
    assert rl_parts <= summary["time/rl_s"] + 0.05 * len(timing.RL_PARTS)
    assert summary["time/eval_s"] >= summary["time/eval_before_s"] + summary["time/eval_after_s"] - 0.1
    assert summary["time/startup_s"] > 0 and summary["time/learner_cpu_s"] > 0
    assert summary["time/workers_cpu_s"] > 0                  # the two local workers, still running
    assert "Where the" in proc.stdout and "waiting for the fleet" in proc.stdout and "CPU s" in proc.stdout
    # The resolved config, for analysis tools: the quick start with the run's flags.
    cfg = experiment_config(os.path.join(ROOT, "experiments", "quickstart.py"),
                            [*TINY, "--config.run.steps=2"])
    assert run_config(workdir).to_dict() == cfg.to_dict()
    recs = [r for r in run_metrics.read_metrics(workdir) if r["phase"] == "rl"]
    steps = [r["step"] for r in recs]
    assert steps == [0, 1, 2]                      # eval before RL, then one record per step
    assert "eval/accuracy" in recs[0] and "eval/accuracy" in recs[1]
    for r in recs[1:]:                             # each step's parts, e.g. its learner compute
        assert r["time/update_s"] > 0 and r["time/step_s"] >= r["time/update_s"]
    assert recs[2]["learner/policy_version"] >= 1  # warm-up 1, then an actor update
    # Workers sample with the learner's weights (pushed before the first lease; their own random
    # init differs): the first actor update sees ratios ~1, so DIS masks almost nothing.
    assert recs[2]["actor/frac_masked_low"] + recs[2]["actor/frac_masked_high"] < 0.2
    assert sum(recs[1]["batch/staleness_counts"]) > 0
    # The log-prob parity gate checked both workers as they joined (docs/fleet.md): each scores
    # the probe set as the learner does (float32 on both sides), at the version it sampled with.
    gaps = {k.split("/")[1]: v for k, v in recs[1].items()
            if k.startswith("parity/") and k.endswith("/mean_gap")}
    assert len(gaps) == 2 and all(0 <= g < 1e-4 for g in gaps.values()), gaps
    for server in gaps:
        assert recs[1][f"parity/{server}/passed"] == 1 and recs[1][f"parity/{server}/version"] == 0
    assert recs[1]["parity/failures"] == 0 and recs[2]["fleet/quarantined"] == 0
    assert os.path.exists(os.path.join(workdir, "sft", "result.json"))
    for i in range(2):                                     # each worker logs its lifecycle
        text = open(os.path.join(workdir, "workers", f"worker{i}.log")).read()
        assert f"worker{i} serving on" in text and f"worker{i} loaded weights version" in text

    # Rerun with one more step: SFT and the first eval come from the cache, RL resumes at step 2.
    proc = run_main(workdir, 3)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SFT loaded from cache" in proc.stdout and "resumed at step 2" in proc.stdout
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert summary["steps"] == 3 and summary["trajectories"] == 24
    assert [r["step"] for r in run_metrics.read_metrics(workdir) if r["phase"] == "rl"] == [0, 1, 2, 3]
    starts = provenance.read_run_info(workdir)             # one record per start of the run
    assert len(starts) == 2 and starts[0]["commit"] and "--workdir=" + workdir in " ".join(
        starts[1]["argv"])

    # The same command again: the run is finished, nothing is evaluated or rewritten.
    with open(os.path.join(workdir, "summary.json"), "rb") as f:
        summary_bytes = f.read()
    n_records = len(run_metrics.read_metrics(workdir))
    proc = run_main(workdir, 3)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "finished its 3 steps; summary.json unchanged" in proc.stdout
    assert "SAO run summary" in proc.stdout and "held-out pass@1" not in proc.stdout
    with open(os.path.join(workdir, "summary.json"), "rb") as f:
        assert f.read() == summary_bytes
    assert len(run_metrics.read_metrics(workdir)) == n_records
    assert len(provenance.read_run_info(workdir)) == 2
