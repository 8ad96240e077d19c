"""Metrics writer / reader round trip, summary file and table."""
import json
import math
import os

import numpy as np
import pytest

from sao import run_metrics


def test_jsonl_round_trip_records_merge(tmp_path):
    wd = str(tmp_path)
    with run_metrics.MetricsWriter(wd, tensorboard=True) as w:
        w.write(0, {"eval/accuracy": np.float32(0.25), "batch/staleness_counts": np.array([3, 1])})
        w.write(1, {"actor/loss": 1.5, "batch/staleness_counts": [0, 2, 5]})
        w.write(1, {"actor/loss": 2.5})  # a resumed run rewrites step 1: later values win
        w.write(0, {"sft/loss": 3.0}, phase="sft")
    recs = run_metrics.read_metrics(wd)
    rl = [r for r in recs if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [0, 1]
    assert rl[0]["eval/accuracy"] == pytest.approx(0.25)
    assert rl[1]["actor/loss"] == 2.5 and rl[1]["batch/staleness_counts"] == [0, 2, 5]
    assert os.listdir(os.path.join(wd, "tb"))  # TensorBoard events written
    np.testing.assert_array_equal(run_metrics.staleness_histogram(wd), [3, 3, 5])
    df = run_metrics.load_run(wd)
    assert list(df.index) == [0, 1]
    assert run_metrics.load_run(wd, "sft")["sft/loss"].iloc[0] == 3.0


def test_truncated_line_ignored_and_nan_kept(tmp_path):
    wd = str(tmp_path)
    w = run_metrics.MetricsWriter(wd, tensorboard=False)
    w.write(0, {"actor/loss": float("nan"), "actor/x": float("inf")})
    w.close()
    with open(os.path.join(wd, run_metrics.METRICS_FILE), "a") as f:
        f.write('{"step": 1, "actor/lo')
    (rec,) = run_metrics.read_metrics(wd)
    assert rec["actor/loss"] is None and math.isinf(rec["actor/x"])


def test_bad_keys_and_steps_raise(tmp_path):
    w = run_metrics.MetricsWriter(str(tmp_path), tensorboard=False)
    with pytest.raises(ValueError, match="namespaced"):
        w.write(0, {"loss": 1.0})
    with pytest.raises(ValueError, match=">= 0"):
        w.write(-1, {"a/b": 1.0})
    w.close()


def test_summary_file_and_table(tmp_path):
    from rich.console import Console
    summary = dict(accuracy_before=0.2, accuracy_after=0.7, tool_use_before=0.3,
                   tool_use_after=0.95, steps=40, trajectories=1280, dropped=3, wall_s=612.5)
    path = os.path.join(str(tmp_path), run_metrics.SUMMARY_FILE)
    run_metrics.write_json(path, summary)
    assert json.load(open(path)) == summary
    run_metrics.write_json(path, {"x": np.float32(0.5), "n": np.int64(3), "a": np.arange(2)})
    assert json.load(open(path)) == {"x": 0.5, "n": 3, "a": [0, 1]}
    with pytest.raises(TypeError):
        run_metrics.write_json(path, {"x": object()})
    console = Console(record=True, width=100)
    console.print(run_metrics.summary_table(summary))
    text = console.export_text()
    assert "20.0%" in text and "70.0%" in text and "95.0%" in text and "1280" in text


def test_budget_charges_warm_up_pretraining_and_group_drops(tmp_path):
    # 12 learner steps of 8, 2 of them critic warm-up (policy version 10), 16 value-pretraining
    # samples, 3 fleet drops and 5 + 1 GRPO rows dropped with their groups.
    from sao.run_metrics import MetricsWriter, budget
    with MetricsWriter(str(tmp_path), tensorboard=False) as w:
        w.write(0, {"value_pretrain/explained_variance": 0.1, "value_pretrain/trajectories": 16},
                phase="value_pretrain")
        w.write(11, {"groups/dropped_rows": 2, "groups/late_rows": 0})
        w.write(12, {"groups/dropped_rows": 5, "groups/late_rows": 1})
    b = budget(str(tmp_path), batch_size=8, steps=12, policy_version=10, fleet={"dropped": 3})
    assert b == {"actor_updates": 10, "actor_trajectories": 80, "critic_only_trajectories": 16,
                 "trained": 96, "pretraining": 16, "dropped": 9, "dropped_groups_rows": 6,
                 "generated": 121}
