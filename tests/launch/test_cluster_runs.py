"""Each launcher's real generated script, run end to end by the cluster in a box (launch/localcluster).

``launch/gpu_slurm.py`` submits its sbatch script (``sbatch --wait``); the box
runs it: ``srun`` starts ``launch/sglang_fleet.py`` on the fleet node (one
rollout worker starting its own SGLang server on CPU: the real SGLang server
when ``make sglang-real-venv`` installed it, else sglang-jax) and the learner
on the learner node; ``launch/tpu_vm.py`` creates a one-host TPU VM in the
box, sets up the fleet machine, starts the fleet there over ``gcloud compute
ssh`` and the learner over ``tpu-vm ssh --worker=all``. Checked: 2 learner
steps, the job's (or launcher's) exit status is the learner's, nothing the
launch started is left running (every process the box started carries its
tag), the TPU VM the launcher created is deleted, every ``--set`` value
arrives intact (the learner's ``config.json``); a learner killed mid-run ends
the whole job with its status and stops the servers. Model: launch/tiny_model.py
(cached under ~/.cache/sao). Durations are printed (``pytest -s``).
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from cluster import (ROOT, RUN_SETS, box, box_env, fleet_flags, free_ports, logs, run)
from wandb_offline import wandb_history

from launch import tiny_model
from sao import run_metrics

NAME = """run "quoted" 'single' (paren) $HOME $(not run) `nor this` \\back *"""

pytestmark = [pytest.mark.slow, pytest.mark.sglang, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def model_dir():
    return tiny_model.cached()


def sets() -> list[str]:
    return [w for s in (*RUN_SETS, f"name={NAME}") for w in ("--set", s)]


def slurm_argv(workdir, model, *extra) -> list[str]:
    backend, sglang_python, fleet_args = fleet_flags()
    return [sys.executable, "launch/gpu_slurm.py", "--config=experiments/sao_math.py:fleet_cpu",
            f"--workdir={workdir}", f"--model={model}", "--learner_nodes=1", "--fleet_nodes=1",
            "--gpus_per_node=1", f"--backend={backend}", f"--sglang_python={sglang_python}",
            f"--fleet_args={fleet_args}", "--no_install", f"--repo_dir={ROOT}", "--time=00:30:00",
            f"--coordinator_port={free_ports(1)}", f"--worker_port={free_ports(1)}",
            f"--sglang_port={free_ports(1)}", *extra, *sets()]


def check_finished(workdir: pathlib.Path, box_dir: pathlib.Path) -> None:
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["policy_version"] == 2, summary
    assert json.loads((workdir / "config.json").read_text())["name"] == NAME  # --set intact
    left = [c for c in box.calls(str(box_dir)) if c.get("event") == "leftover"]
    assert not left, left                               # everything stopped on its own
    assert not box.tagged(str(box_dir))


def test_slurm_job_runs_two_steps_and_ends_with_the_learner(tmp_path, model_dir):
    box_dir, workdir = tmp_path / "box", tmp_path / "run"
    out = run(slurm_argv(workdir, model_dir, "--wait"), box_env(box_dir))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:] + logs(workdir)
    check_finished(workdir, box_dir)
    end = [c for c in box.calls(str(box_dir)) if c.get("event") == "job_end"]
    assert [(e["state"], e["exit_code"]) for e in end] == [("COMPLETED", 0)]
    assert "metrics" in out.stderr and str(workdir) in out.stderr     # where the records are
    servers = list((workdir / "workers").glob("sglang*.log"))
    assert servers, "no SGLang server ran"


def test_a_killed_learner_ends_the_slurm_job_with_its_status(tmp_path, model_dir):
    box_dir, workdir = tmp_path / "box", tmp_path / "run"
    env = box_env(box_dir)
    out = run(slurm_argv(workdir, model_dir), env)    # submits and returns
    assert out.returncode == 0, out.stderr[-3000:]
    deadline = time.monotonic() + 1200
    learner = None
    while time.monotonic() < deadline:                 # the first weight push starts the server
        procs = box.tagged(str(box_dir), "job:1")
        servers = [p for p, c in procs.items() if "launch_server" in c]
        learners = [p for p, c in procs.items() if "--role=learner" in c and "sao.main" in c]
        if servers and learners:
            learner = min(learners)
            break
        time.sleep(1)
    assert learner, logs(workdir)
    os.kill(learner, signal.SIGKILL)
    while time.monotonic() < deadline:
        state = subprocess.run(["sacct", "-j", "1", "-n", "-P", "-o", "State,ExitCode"], env=env,
                               capture_output=True, text=True).stdout.strip()
        if state and not state.startswith(("RUNNING", "PENDING")):
            break
        time.sleep(1)
    assert state == "FAILED|137:0", state                # the learner's status: SIGKILL
    assert not [c for c in box.calls(str(box_dir)) if c.get("event") == "leftover"]
    assert not box.tagged(str(box_dir))


def test_tpu_vm_launch_runs_two_steps_and_deletes_its_vm(tmp_path, model_dir):
    box_dir, workdir = tmp_path / "box", tmp_path / "run"
    backend, sglang_python, fleet_args = fleet_flags()
    argv = [sys.executable, "launch/tpu_vm.py", "--config=experiments/sao_math.py:fleet_cpu",
            f"--workdir={workdir}", f"--model={model_dir}", "--tpu=box-tpu", "--zone=box-a",
            "--accelerator=v4-8", "--fleet=localhost", "--servers_per_machine=1",
            f"--fleet_args=--backend={backend} {fleet_args} --sglang_port={free_ports(1)}",
            f"--sglang_python={sglang_python}", "--no_install", f"--repo_dir={ROOT}",
            f"--python={ROOT}/.venv/bin/python", f"--token_dir={tmp_path}/token",
            f"--coordinator_port={free_ports(1)}", f"--worker_port={free_ports(1)}", *sets(),
            "--set", "model.mesh.data=-1",              # the host's 4 chips (4 CPU devices here)
            "--set", "run.wandb_project=sao-box"]        # W&B beside TensorBoard, offline
    out = run(argv, {**box_env(box_dir), "WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:] + logs(workdir)
    check_finished(workdir, box_dir)
    logged = {k for r in wandb_history(workdir) for k in r if not k.startswith("_")}
    rl = {k for r in run_metrics.read_metrics(str(workdir)) if r["phase"] == "rl"
          for k, v in r.items() if "/" in k and isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert rl and rl <= logged, rl - logged                # the same keys as metrics.jsonl
    gcloud = [c["argv"] for c in box.calls(str(box_dir)) if c["tool"] == "gcloud"]
    assert gcloud[0][:5] == ["compute", "tpus", "tpu-vm", "create", "box-tpu"]
    assert gcloud[-1][:5] == ["compute", "tpus", "tpu-vm", "delete", "box-tpu"]
    assert not (box_dir / "gcloud" / "tpu" / "box-tpu").exists()
