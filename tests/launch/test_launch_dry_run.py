"""Launchers in --dry-run mode print exactly the commands they would run."""
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dry_run(script, *args):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", script), *args, "--dry-run"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_local_launch_commands():
    lines = dry_run("local.py", "--config=experiments/quickstart.py", "--workdir=/tmp/qs",
                    "--workers=3", "--base_port=6000", "--python=python", "--set", "run.steps=5")
    assert len(lines) == 5
    assert lines[0].startswith("[local] python -c") and "ensure_token_file" in lines[0]  # before workers
    lines = lines[1:]
    for i, line in enumerate(lines[:3]):
        assert line.startswith(f"[worker{i}] ") and line.endswith(" &")
        argv = shlex.split(line.split("] ", 1)[1][:-2])
        assert argv[:3] == ["python", "-m", "sao.main"]
        assert "--role=rollout" in argv and f"--port={6000 + i}" in argv and "--config.run.steps=5" in argv
        assert "--config.rollout.token_file=/tmp/qs/fleet.token" in argv
    learner = shlex.split(lines[3].split("] ", 1)[1])
    assert "--role=learner" in learner
    assert "--config.rollout.worker_addresses=127.0.0.1:6000,127.0.0.1:6001,127.0.0.1:6002" in learner


def test_tpu_vm_launch_commands():
    lines = dry_run("tpu_vm.py", "--config=experiments/sao_math.py:qwen3_30b_a3b",
                    "--workdir=gs://b/run", "--tpu=t1", "--accelerator=v5p-64", "--fleet=f0,f1",
                    "--servers_per_machine=2")
    assert "tpus tpu-vm create t1" in lines[0] and "--accelerator-type=v5p-64" in lines[0]
    assert "--worker=all" in lines[1] and "pip install" in lines[1]
    assert sum("launch/sglang_fleet.py" in l for l in lines) == 2
    learner = lines[-1]
    assert "--worker=all" in learner and "--role=learner" in learner
    assert "JAX_NUM_PROCESSES=8" in learner and "JAX_COORDINATOR_ADDRESS=t1-w-0:8476" in learner
    assert "rollout.worker_addresses=f0:50151,f0:50152,f1:50151,f1:50152" in learner


def test_slurm_script():
    lines = dry_run("gpu_slurm.py", "--config=experiments/sao_math.py:qwen3_8b", "--workdir=/shared/r",
                    "--learner_nodes=2", "--fleet_nodes=3", "--gpus_per_node=4")
    text = "\n".join(lines)
    assert lines[0] == "# /shared/r/sao.sbatch" and lines[1] == "#!/bin/bash"
    assert "#SBATCH --nodes=2 --gpus-per-node=4" in text and "#SBATCH hetjob" in text
    assert "#SBATCH --nodes=3 --gpus-per-node=4" in text
    assert "JAX_PROCESS_ID=$SLURM_PROCID" in text and "--role=learner" in text
    assert "launch/sglang_fleet.py" in text and "--servers=4" in text
    assert lines[-1] == "[local] sbatch /shared/r/sao.sbatch"


def test_sglang_fleet_commands():
    lines = dry_run("sglang_fleet.py", "--config=experiments/sao_math.py:qwen3_8b", "--workdir=/r",
                    "--model=/m", "--servers=2", "--tp=2", "--python=python")
    assert len(lines) == 4
    server1 = shlex.split(lines[2].split("] ", 1)[1][:-2])
    assert server1[:3] == ["python", "-m", "sglang.launch_server"]
    assert server1[server1.index("--port") + 1] == "30001" and server1[server1.index("--base-gpu-id") + 1] == "2"
    worker1 = lines[3]
    assert "--sglang_url=http://127.0.0.1:30001" in worker1 and "--port=50152" in worker1
    assert "--config.rollout.engine=sglang" in worker1


def test_sglang_jax_servers_disable_the_overlap_scheduler():
    lines = dry_run("sglang_fleet.py", "--config=experiments/sao_math.py:qwen3_8b", "--workdir=/r",
                    "--model=/m", "--servers=1", "--backend=jax", "--python=python")
    server0 = shlex.split(lines[0].split("] ", 1)[1][:-2])
    assert server0[2] == "sgl_jax.launch_server" and "--disable-overlap-schedule" in server0


def test_full_scale_variants_are_not_deterministic_by_default():
    sys.path.insert(0, ROOT)
    from experiments import sao_math
    assert sao_math.get_config("qwen3_8b").learner.deterministic is False
    assert sao_math.get_config("cpu").learner.deterministic is True


def test_launchers_make_the_token_first_and_pass_its_path_never_the_token(tmp_path):
    """Slurm: created in the shared workdir before sbatch, every role gets the path.
    TPU VM: created locally, copied 0600 to each machine before its role starts;
    the learner gets the CA, the workers the certificate and key."""
    lines = dry_run("gpu_slurm.py", "--config=experiments/sao_math.py:qwen3_8b", "--workdir=/shared/r",
                    "--set", "rollout.tls_ca=/shared/ca.pem")
    create = [i for i, l in enumerate(lines) if "ensure_token_file" in l]
    assert create == [len(lines) - 2] and lines[create[0]].endswith(" /shared/r")
    script = "\n".join(lines)
    fleet = next(l for l in lines if "launch/sglang_fleet.py" in l)
    learner = next(l for l in lines if "--role=learner" in l)
    for role in (fleet, learner):
        assert "rollout.token_file=/shared/r/fleet.token" in role and "rollout.tls_ca=/shared/ca.pem" in role
    assert "--host=0.0.0.0" in fleet and "Bearer" not in script
    token_dir = tmp_path / "tok"
    lines = dry_run("tpu_vm.py", "--config=experiments/sao_math.py:qwen3_30b_a3b", "--workdir=gs://b/run",
                    "--tpu=t1", "--fleet=f0,f1", "--servers_per_machine=1", f"--token_dir={token_dir}",
                    "--tls_cert=/c/cert.pem", "--tls_key=/c/key.pem", "--tls_ca=/c/ca.pem")
    assert not token_dir.exists()                                   # a dry run makes nothing
    create = next(i for i, l in enumerate(lines) if "ensure_token_file" in l)
    assert lines[create].endswith(str(token_dir))
    for machine in ("t1", "f0", "f1"):
        scp = next(i for i, l in enumerate(lines) if " scp " in l and f" {machine}:.sao/" in l)
        chmod = next(i for i, l in enumerate(lines) if f"ssh {machine} " in l and "chmod 600" in l)
        start = next(i for i, l in enumerate(lines) if f"ssh {machine} " in l and "sao.main" in l
                     or f"ssh {machine} " in l and "sglang_fleet.py" in l)
        assert create < scp < chmod < start
        assert f"{token_dir}/fleet.token" in lines[scp]
        assert ("/c/ca.pem" in lines[scp]) == (machine == "t1")         # CA to the learner only
        assert ("/c/key.pem" in lines[scp]) == (machine != "t1")        # key to the workers only
        assert "rollout.token_file=$HOME/.sao/fleet.token" in lines[start]
    learner = lines[-1]
    assert "rollout.tls_ca=$HOME/.sao/ca.pem" in learner and "tls_key" not in learner
    assert all("rollout.tls_key=$HOME/.sao/key.pem" in l for l in lines if "sglang_fleet.py" in l)
