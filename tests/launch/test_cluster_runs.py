"""Each launcher's real generated script, run end to end by the cluster in a box (launch/localcluster).

The commands are README.md's own ("Full scale"), with the run's directories
under the test's, free ports and the run cut to 2 learner steps appended
(README's one-machine ``launch/sglang_fleet.py --learner`` runs in
tests/rollout/test_sglang_real_server.py, with the same no-leftover check); ``launch/gpu_slurm.py``
submits its sbatch script (``--wait``) and the box runs it: ``srun`` starts
``launch/sglang_fleet.py`` on the fleet node (a rollout worker starting its
own SGLang server, SGLang's CPU engine) and the learner on the learner node;
``launch/tpu_vm.py`` creates a one-host TPU VM in the box, starts the fleet on
the fleet machine over ``gcloud compute ssh`` (a worker starting an sglang-jax
server, restarted on every push) and the learner over ``tpu-vm ssh
--worker=all``; that run, at ``tau=0``, also passes every check of an SGLang
fleet run (tests/e2e/fleet_run.py: lag-0 log-prob equality, the parity gate,
changing weights, tool calls in the sandbox, evaluation through the fleet).
Checked: 2 learner steps, the job's (or launcher's) exit status is the learner's, nothing the launch started is left running (every
process the box started carries its tag), the TPU VM the launcher created is
deleted, every ``--set`` value arrives intact (the learner's
``config.json``); a learner killed mid-run ends the whole job with its status
and stops the servers. Model: ``launch/tiny_model.py`` (README's command,
cached under ~/.cache/sao). Durations are printed (``pytest -s``).
"""
import json
import os
import shlex
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from cluster import (HAVE_REAL, JAX_PYTHON, JAX_SERVER_ARGS, ROOT, RUN_SETS, box, box_env, fleet_flags,
                     free_ports, in_tmp, logs, readme_command, run, run_shell, user_env)
from wandb_offline import wandb_history

sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from fleet_run import STEPS, check_run, server_starts  # noqa: E402

from launch import tiny_model
from sao import run_metrics
from sao.rollout import sglang_server

NAME = """run "quoted" 'single' (paren) $HOME $(not run) `nor this` \\back *"""

pytestmark = [pytest.mark.slow, pytest.mark.sglang, pytest.mark.timeout(2400)]
NEEDS_REAL = pytest.mark.skipif(not HAVE_REAL, reason="no SGLang environment (make sglang-real-venv)")
NEEDS_JAX = pytest.mark.skipif(not JAX_PYTHON.exists(), reason=f"no {JAX_PYTHON} (make sglang-venv)")


@pytest.fixture(scope="module")
def model_dir():
    return tiny_model.cached()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, model_dir):
    """README's ``runs/`` with its model, written by README's command (a copy of the cache)."""
    tmp = tmp_path_factory.mktemp("readme")
    out = run_shell(in_tmp(readme_command("tiny_model.py"), tmp), user_env())
    assert out.returncode == 0, out.stderr[-2000:]
    return tmp


def sets() -> list[str]:
    return [w for s in (*RUN_SETS, f"name={NAME}") for w in ("--set", s)]


def extra(*flags: str) -> str:
    """Shell words appended to a README command: ``flags``, then the test's ``--set`` values."""
    return " " + " ".join(shlex.quote(w) for w in (*flags, *sets()))


def readme_run(tmp, box_dir, *needles: str, flags=(), env=None):
    """Runs README's command with ``needles`` (after its ``export`` line for the box)."""
    command = in_tmp(readme_command(*needles), tmp, box_dir) + extra(*flags)
    if box_dir is not None:
        command = in_tmp(readme_command("export PATH="), tmp, box_dir) + " && " + command
    return run_shell(command, env or user_env())


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


@NEEDS_REAL
def test_slurm_job_runs_two_steps_and_ends_with_the_learner(tmp_path, runs):
    box_dir = tmp_path / "box"
    workdir = runs / "runs" / "slurm"
    out = readme_run(runs, box_dir, "gpu_slurm.py", "fleet_cpu",
                     flags=(f"--coordinator_port={free_ports(1)}", f"--worker_port={free_ports(1)}",
                            f"--sglang_port={free_ports(1)}", "--time=00:40:00"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:] + logs(workdir)
    check_finished(workdir, box_dir)
    end = [c for c in box.calls(str(box_dir)) if c.get("event") == "job_end"]
    assert [(e["state"], e["exit_code"]) for e in end] == [("COMPLETED", 0)]
    assert f"metrics {workdir}/metrics.jsonl" in out.stderr     # where the records are
    assert list((workdir / "workers").glob("sglang*.log")), "no SGLang server ran"


@pytest.mark.skipif(not (HAVE_REAL or JAX_PYTHON.exists()), reason="no SGLang environment")
def test_a_killed_learner_ends_the_slurm_job_with_its_status(tmp_path, model_dir):
    box_dir, workdir = tmp_path / "box", tmp_path / "run"
    env = box_env(box_dir)
    out = run(slurm_argv(workdir, model_dir), env)    # submits and returns
    assert out.returncode == 0, out.stderr[-3000:]
    deadline = time.monotonic() + 1200
    learner = None
    while time.monotonic() < deadline:                 # the first weight push starts the server
        procs = box.tagged(str(box_dir), "job:1")
        # By the module a process runs (``python -m X``): the srun shim, the worker and
        # ``bash -c`` carry the learner's or the server's command line in their arguments.
        servers = [p for p, c in procs.items() if c.split()[1:3] in (["-m", "sglang.launch_server"],
                                                                     ["-m", "sgl_jax.launch_server"])]
        learners = [p for p, c in procs.items() if c.split()[1:3] == ["-m", "sao.main"] and "--role=learner" in c]
        ready = any(sglang_server.READY_LINE in p.read_text(errors="replace")
                    for p in (workdir / "workers").glob("sglang*.log"))
        if servers and learners and ready:                # killed while its server serves
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


@NEEDS_JAX
def test_tpu_vm_launch_runs_two_steps_and_deletes_its_vm(tmp_path, runs):
    box_dir = tmp_path / "box"
    workdir = runs / "runs" / "tpu"
    # README's own --fleet_args (the backend), then a free port and the test's server shapes.
    readme_fleet = [w.split("=", 1)[1] for w in shlex.split(readme_command("tpu_vm.py", "fleet_cpu"))
                    if w.startswith("--fleet_args=")]
    assert readme_fleet and "--backend=jax" in readme_fleet[0], readme_fleet
    fleet_args = (f"{readme_fleet[0]} --sglang_port={free_ports(1)} "
                  + shlex.quote(f"--server_args={JAX_SERVER_ARGS}"))
    out = readme_run(runs, box_dir, "tpu_vm.py", "fleet_cpu",
                     flags=(f"--token_dir={tmp_path}/token", f"--coordinator_port={free_ports(1)}",
                            f"--worker_port={free_ports(1)}", "--tpu=box-tpu",
                            f"--fleet_args={fleet_args}",
                            "--set", "rollout.tau=0", "--set", "run.record_batches=True",
                            "--set", "run.wandb_project=sao-box"),     # W&B beside TensorBoard, offline
                     env={**user_env(), "WANDB_MODE": "offline", "WANDB_SILENT": "true"})
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
    # The fleet machine's sglang-jax server: every check of an SGLang fleet run at tau = 0
    # (tests/e2e/fleet_run.py), and every push reloaded by a restart (sglang-jax has no
    # /update_weights_from_disk): one start per version v0..v2.
    facts = check_run(workdir, str(runs / "runs" / "tiny_qwen3"), servers=1)
    starts, _ = server_starts(workdir, 0)
    assert [pathlib.Path(p).parent.name for p in starts] == [f"v{v:010d}" for v in range(STEPS + 1)]
    print(f"\nTPU VM box, sglang-jax: max |log ratio| per step {facts['gaps']}, recomputed "
          f"{facts['recomputed_gaps']}, {facts['tool_calls_ran']} tool calls ran, learner "
          f"{facts['wall_s']:.0f} s")
