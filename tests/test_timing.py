"""sao.timing: the stopwatch, the summary's time/... keys and their table."""
import time

import pytest
from rich.console import Console

from sao import timing


def test_stopwatch_adds_durations_per_part_also_when_the_block_raises():
    w = timing.Stopwatch()
    with w.part("a"):
        time.sleep(0.01)
    with pytest.raises(RuntimeError), w.part("a"):
        time.sleep(0.01)
        raise RuntimeError("boom")
    w.add("b", 1.5, 1.0)
    assert w.get("a") >= 0.02 and w.get("b") == 1.5 and w.get("missing") == 0.0
    assert w.get_cpu("a") < w.get("a") and w.get_cpu("b") == 1.0   # sleeping takes no CPU
    assert list(w.totals) == ["a", "b"]
    for bad in ((-1.0, 0.0), (1.0, -1.0)):
        with pytest.raises(ValueError):
            w.add("b", *bad)
    other = timing.Stopwatch()
    other.add("b", 0.5, 0.25)
    other.add("c", 2.0)
    w.merge(other)
    assert (w.get("b"), w.get_cpu("b"), w.get("c"), w.get_cpu("c")) == (2.0, 1.25, 2.0, 0.0)


def test_stopwatch_counts_the_cpu_of_busy_blocks():
    w = timing.Stopwatch()
    with w.part("busy"):
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass
    assert w.get_cpu("busy") >= 0.05 and w.get("busy") >= w.get_cpu("busy") * 0.5


def hand_made():
    """Phases of 100 s (CPU: half of each, so 50 s), the RL parts of their 30 s."""
    phases, rl = timing.Stopwatch(), timing.Stopwatch()
    for name, s in (("sft", 40.0), ("eval_before", 10.0), ("value_pretrain", 8.0),
                    ("value_pretrain/sample", 6.0), ("value_pretrain/fit", 2.0), ("rl", 30.0),
                    ("eval_after", 9.0)):
        phases.add(name, s, s / 2)
    for name, s in (("update", 12.0), ("wait_fleet", 6.0), ("publish", 3.0), ("eval", 5.0),
                    ("checkpoint", 1.0), ("batch", 0.5), ("log", 0.5)):
        rl.add(name, s, s / 2)
    return phases, rl


def test_breakdown_by_hand():
    phases, rl = hand_made()
    out = timing.breakdown(phases, rl, wall_s=100.0)
    assert out["time/sft_s"] == 40.0 and out["time/sft_frac"] == 0.4
    assert out["time/setup_s"] == 3.0                       # 100 - (40 + 10 + 8 + 30 + 9)
    assert out["time/rl/update_s"] == 12.0 and out["time/rl/update_frac"] == 0.12
    assert out["time/rl/other_s"] == 2.0                    # 30 - 28
    assert out["time/eval_s"] == 24.0                       # 10 before + 5 during + 9 after
    assert out["time/value_pretrain/sample_s"] == 6.0
    assert sum(out[f"time/{p}_s"] for p in timing.PHASES) == pytest.approx(100.0)
    assert sum(out[f"time/rl/{p}_s"] for p in (*timing.RL_PARTS, "other")) == pytest.approx(30.0)
    assert not any(k.endswith("_cpu_s") for k in out)      # no process CPU given
    cpu = timing.breakdown(phases, rl, wall_s=100.0, cpu_s=60.0)
    assert cpu["time/sft_cpu_s"] == 20.0 and cpu["time/rl/update_cpu_s"] == 6.0
    assert cpu["time/setup_cpu_s"] == 11.5                  # 60 - (20 + 5 + 4 + 15 + 4.5)
    assert cpu["time/rl/other_cpu_s"] == 1.0 and cpu["time/eval_cpu_s"] == 12.0
    assert {k: v for k, v in cpu.items() if not k.endswith("_cpu_s")} == out


def test_breakdown_rejects_phases_longer_than_the_wall_time():
    phases, rl = hand_made()
    with pytest.raises(ValueError, match="exceed"):
        timing.breakdown(phases, rl, wall_s=50.0)
    with pytest.raises(ValueError, match="wall_s"):
        timing.breakdown(phases, rl, wall_s=0.0)


def test_table_lists_the_parts_with_their_share():
    phases, rl = hand_made()
    summary = {"wall_s": 100.0, **timing.breakdown(phases, rl, wall_s=100.0, cpu_s=60.0),
               "time/startup_s": 4.2,
               "time/learner_cpu_s": 150.0, "time/workers_cpu_s": 80.0}
    console = Console(width=120, record=True)
    console.print(timing.table(summary))
    text = console.export_text()
    assert "Where the 100 s went" in text
    assert "waiting for the fleet" in text and "12.0%" in text   # rl/update 12 s of 100
    assert "CPU s" in text and "11.5" in text                      # the setup's CPU
    assert "CPU only: rollout workers" in text and "80.0" in text


def test_process_clocks():
    assert timing.startup_s() > 0.0
    own, children = timing.cpu_s()
    assert own > 0.0 and children >= 0.0
