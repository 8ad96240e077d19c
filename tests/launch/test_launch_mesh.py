"""Launchers size the learner mesh for the devices they ask for, and refuse a
mesh that cannot fit before anything starts."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from launch.mesh_check import learner_mesh  # noqa: E402


def launch(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "launch", script), *args, "--dry-run"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("variant, want", [
    ("qwen3_30b_a3b", {"data": 1, "fsdp": 8, "tensor": 1, "expert": 4}),
    ("qwen3_8b", {"data": 1, "fsdp": 32, "tensor": 1, "expert": 1}),
    ("qwen3_1p7b", {"data": 8, "fsdp": 4, "tensor": 1, "expert": 1}),
])
def test_full_scale_meshes_fit_the_default_launches(variant, want):
    assert learner_mesh(f"experiments/sao_math.py:{variant}", [], 32, "32 devices") == want


def test_a_mesh_that_cannot_fit_is_refused_with_needed_and_found():
    with pytest.raises(SystemExit, match=r"does not fit 6 GPUs: .*multiple of 4 devices.*found 6"):
        learner_mesh("experiments/sao_math.py:qwen3_30b_a3b", [], 6, "6 GPUs")
    with pytest.raises(SystemExit, match=r"needs 64 devices; found 32"):
        learner_mesh("experiments/sao_math.py:qwen3_8b", ["model.mesh.fsdp=64"], 32, "32 GPUs")


def test_launchers_refuse_before_printing_a_step():
    out = launch("gpu_slurm.py", "--config=experiments/sao_math.py:qwen3_30b_a3b",
                 "--workdir=/tmp/x", "--learner_nodes=1", "--gpus_per_node=6")
    assert out.returncode != 0 and out.stdout == ""
    assert "1 learner nodes x 6 GPUs" in out.stderr and "found 6" in out.stderr
    out = launch("tpu_vm.py", "--config=experiments/sao_math.py:qwen3_30b_a3b", "--workdir=gs://b/r",
                 "--fleet=f0", "--accelerator=v5p-8", "--set", "model.mesh.expert=8")
    assert out.returncode != 0 and "v5p-8 (4 chips)" in out.stderr and "found 4" in out.stderr
    out = launch("gpu_slurm.py", "--config=experiments/sao_math.py:qwen3_30b_a3b", "--workdir=/tmp/x")
    assert out.returncode == 0, out.stderr                   # 4 nodes x 8 GPUs: fsdp 8 x expert 4
