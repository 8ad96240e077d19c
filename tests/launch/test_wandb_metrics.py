"""Optional Weights & Biases logging (``run.wandb_project``; the ``wandb`` extra), offline:
the same scalars under the same names as TensorBoard, and nothing without a project."""
from wandb_offline import wandb_history

from sao import run_metrics


def test_metrics_go_to_wandb_with_tensorboards_names(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    with run_metrics.MetricsWriter(str(tmp_path), wandb_project="sao-test", run_name="t",
                                   run_config={"seed": 3}) as w:
        w.write(0, {"sft/loss": 1.5}, phase="sft")
        w.write(1, {"actor/loss": 0.5, "batch/staleness_counts": [3, 1]})
        w.write(2, {"actor/loss": 0.25, "eval/accuracy": 0.5})
    rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in wandb_history(tmp_path)]
    assert rows == [{"sft/sft/loss": 1.5, "sft/step": 0}, {"actor/loss": 0.5, "step": 1},
                    {"actor/loss": 0.25, "eval/accuracy": 0.5, "step": 2}]
    assert len(run_metrics.read_metrics(str(tmp_path))) == 3          # the JSONL as before


def test_off_by_default(tmp_path):
    with run_metrics.MetricsWriter(str(tmp_path)) as w:
        w.write(1, {"actor/loss": 0.5})
    assert not (tmp_path / "wandb").exists()
