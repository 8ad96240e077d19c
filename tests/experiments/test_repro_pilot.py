"""The pilot's degradation criterion (experiments/repro/pilot.py) on written metrics."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from experiments.repro import pilot  # noqa: E402
from sao import run_metrics  # noqa: E402


def _run(tmp_path, name, accs, ents):
    d = str(tmp_path / name)
    with run_metrics.MetricsWriter(d, tensorboard=False) as w:
        for step, (acc, ent) in enumerate(zip(accs, ents), start=1):
            w.write(step, {"learner/step": float(step), "actor/entropy": ent,
                           **({"eval/accuracy": acc} if acc is not None else {})})
    return d


def test_drop_and_collapse_are_detected(tmp_path):
    stable = pilot.read_pilot(_run(tmp_path, "a", [0.5, None, 0.55, 0.52], [1.0, 0.9, 0.8, 0.8]))
    assert not stable["degraded"] and stable["steps"] == 4
    drop = pilot.read_pilot(_run(tmp_path, "b", [0.5, None, 0.6, 0.45], [1.0, 0.9, 0.8, 0.8]))
    assert drop["degraded"] and "15.0 points below" in drop["why"]
    collapse = pilot.read_pilot(_run(tmp_path, "c", [0.5, None, 0.5, 0.5], [1.0, 0.5, 0.2, 0.1]))
    assert collapse["degraded"] and "entropy collapsed" in collapse["why"]
    assert "did not degrade" in pilot.describe(str(tmp_path / "a"))
