"""Every full-scale variant builds its mesh on the device count its launchers ask
for (32: a v5p-64 slice, 4 Slurm nodes x 8 GPUs) from its own config, and runs
one SAO update there with a scaled-down preset (fake CPU devices, one process)."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from experiments import common  # noqa: E402

WANT = {"qwen3_30b_a3b": {"data": 1, "fsdp": 8, "tensor": 1, "expert": 4},
        "qwen3_8b": {"data": 1, "fsdp": 32, "tensor": 1, "expert": 1},
        "qwen3_1p7b": {"data": 8, "fsdp": 4, "tensor": 1, "expert": 1}}


@pytest.mark.slow
def test_full_scale_variants_build_and_update_on_the_launch_device_count():
    assert set(WANT) == set(common.FULL_SCALE)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, os.path.join(HERE, "full_scale_child.py"),
                          str(common.LAUNCH_DEVICES), *sorted(WANT)],
                         capture_output=True, text=True, timeout=1200, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    rows = {r["variant"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert set(rows) == set(WANT)
    for variant, row in rows.items():
        assert row["devices"] == 32 and row["mesh"] == WANT[variant], row
        assert row["policy_version"] == 1 and row["actor_moved"] and row["finite"], row
    assert rows["qwen3_8b"]["embed_spec"] == "P(None, 'fsdp')"   # vocab x embed
