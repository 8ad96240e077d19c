"""Launchers in --dry-run mode print exactly the commands they would run."""
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dry_run(script, *args):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", script), *args, "--dry-run"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
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
    assert "--version=v2-alpha-tpuv5" in lines[0]              # v5p's runtime, by default
    assert "<--repo URL>" in lines[1]                          # a dry run shows what --repo fills
    assert "--worker=all" in lines[1] and "pip install" in lines[1]
    assert sum("launch/sglang_fleet.py" in l for l in lines) == 2
    learner = next(l for l in lines if "--role=learner" in l)
    assert "--worker=all" in learner and "--role=learner" in learner
    at_exit = [l for l in lines if l.startswith("[local, at exit]")]
    for vm in ("f0", "f1"):                    # every fleet VM's servers stopped, then the TPU deleted
        assert (f"[local, at exit] gcloud compute ssh {vm} --zone=us-east5-a '--command=kill -TERM "
                "$(cat $HOME/.sao/fleet-t1.pid) 2>/dev/null; rm -f $HOME/.sao/fleet-t1.pid; true'") in at_exit
    assert at_exit[-1] == "[local, at exit] gcloud compute tpus tpu-vm delete t1 --zone=us-east5-a --quiet"
    assert "JAX_NUM_PROCESSES=8" in learner and "JAX_COORDINATOR_ADDRESS=t1-w-0:8476" in learner
    assert "rollout.worker_addresses=f0:50151,f0:50152,f1:50151,f1:50152" in learner


def test_slurm_script():
    lines = dry_run("gpu_slurm.py", "--config=experiments/sao_math.py:qwen3_8b", "--workdir=/shared/r",
                    "--learner_nodes=2", "--fleet_nodes=3", "--gpus_per_node=4")
    text = "\n".join(lines)
    assert lines[0] == "# /shared/r/sao.sbatch" and lines[1] == "#!/bin/bash"
    assert "#SBATCH --nodes=2 --gpus-per-node=4" in text and "#SBATCH hetjob" in text
    assert "#SBATCH --nodes=3 --gpus-per-node=4" in text
    assert 'JAX_PROCESS_ID="$SLURM_PROCID"' in text and "--role=learner" in text
    assert "launch/sglang_fleet.py" in text and "--servers=4" in text
    assert lines[-1] == "[local] sbatch /shared/r/sao.sbatch"


def worker_config(line: str):
    """The config a worker of a dry-run line loads: its experiment plus its ``--config.*`` overrides."""
    sys.path.insert(0, ROOT)
    from experiments import sao_math
    argv = shlex.split(line.split("] ", 1)[1].removesuffix(" &"))
    cfg = sao_math.get_config(next(a for a in argv if a.startswith("--config="))
                              .split(":", 1)[1])
    cfg.unlock()
    for a in argv:
        if a.startswith("--config."):
            key, value = a[len("--config."):].split("=", 1)
            *groups, name = key.split(".")
            node = cfg
            for g in groups:
                node = node[g]
            node[name] = type(node[name])(value)
    return cfg, argv


def test_sglang_fleet_commands():
    """Each worker starts its own server (sglang_setup) on port sglang_port + i, GPU i * tp."""
    from sao import sglang_setup
    lines = dry_run("sglang_fleet.py", "--config=experiments/sao_math.py:qwen3_8b", "--workdir=/r",
                    "--model=/m", "--servers=2", "--tp=2", "--gpus=4", "--python=python")
    assert len(lines) == 3 and "ensure_token_file" in lines[0] and lines[0].endswith(" /r")
    cfg, worker1 = worker_config(lines[2])
    assert lines[2].startswith("[worker1] ") and lines[2].endswith(" &")
    assert worker1[0] == "JAX_PLATFORMS=cpu"           # the worker's own JAX stays off the GPUs
    assert worker1[1:4] == ["python", "-m", "sao.main"] and "--role=rollout" in worker1
    assert "--port=50152" in worker1 and "--worker_index=1" in worker1
    assert cfg.rollout.engine == "sglang" and cfg.model.init == "/m"
    server1 = sglang_setup.make_server(cfg, 1).command()
    assert server1[:3] == ["python", "-m", "sglang.launch_server"]
    assert server1[server1.index("--port") + 1] == "30001" and server1[server1.index("--base-gpu-id") + 1] == "2"
    assert server1[server1.index("--tp") + 1] == "2"
    assert sglang_setup.reload_mode(cfg) == "update_weights_from_disk"


def test_sglang_jax_servers_disable_the_overlap_scheduler():
    from sao import sglang_setup
    lines = dry_run("sglang_fleet.py", "--config=experiments/sao_math.py:qwen3_8b", "--workdir=/r",
                    "--model=/m", "--servers=1", "--backend=jax", "--gpus=1", "--python=python")
    cfg, _ = worker_config(lines[1])
    server0 = sglang_setup.make_server(cfg, 0).command()
    assert server0[2] == "sgl_jax.launch_server" and "--disable-overlap-schedule" in server0
    assert sglang_setup.reload_mode(cfg) == "restart"  # sglang-jax has no update endpoint
    assert sglang_setup.make_server(cfg, 0).nice == 0  # niced on CPU only


def test_sglang_fleet_on_cpu_with_its_learner():
    """--device=cpu gives the backend's CPU flags; --learner adds the learner, in the foreground,
    with the same model and the workers' addresses; server flags, env and path go through."""
    from sao import sglang_setup
    from sao.rollout.sglang_server import JAX_CPU_ARGS
    lines = dry_run("sglang_fleet.py", "--config=experiments/sao_math.py:qwen3_8b", "--workdir=/r",
                    "--model=/m", "--servers=2", "--backend=jax", "--device=cpu", "--python=python",
                    "--sglang_python=/s/bin/python", "--server_args=--max-total-tokens 2048",
                    "--server_env=A=1", "--server_python_path=/p", "--sglang_port=31000",
                    "--learner", "--set", "run.steps=3")
    assert [l.split("]")[0] for l in lines] == ["[local", "[worker0", "[worker1", "[learner"]
    cfg, _ = worker_config(lines[2])
    server = sglang_setup.make_server(cfg, 1)
    command = server.command()
    assert command[:3] == ["/s/bin/python", "-m", "sgl_jax.launch_server"]
    assert command[command.index("--port") + 1] == "31001"
    assert " ".join(JAX_CPU_ARGS) in " ".join(command)
    assert command[-2:] == ["--max-total-tokens", "2048"]  # after the defaults: it wins
    assert server.nice == 10      # sglang-jax's idle loop yields to the learner (docs/rollout.md)
    assert server.environment()["A"] == "1" and server.environment()["PYTHONPATH"].startswith("/p")
    assert cfg.run.steps == 3
    learner = shlex.split(lines[3].split("] ", 1)[1])
    assert not lines[3].endswith("&") and "--role=learner" in learner
    assert "--config.rollout.worker_addresses=127.0.0.1:50151,127.0.0.1:50152" in learner
    assert "--config.model.init=/m" in learner and "--config.run.steps=3" in learner


def test_slurm_script_expands_home(tmp_path):
    """The script's ``cd`` and the fleet's SGLang interpreter use the node's $HOME
    (single quotes kept '$HOME/sao' literal and the job died under set -e)."""
    lines = dry_run("gpu_slurm.py", "--config=experiments/sao_math.py:qwen3_8b", "--workdir=/shared/r")
    cd = next(l for l in lines if l.startswith("cd "))
    fleet = next(l for l in lines if "launch/sglang_fleet.py" in l)
    assert '--sglang_python="$HOME/.cache/sao/sglang-0.5.23/bin/python"' in fleet
    fake = str(tmp_path)  # the node's $HOME, holding sao/.venv/bin/activate
    os.makedirs(os.path.join(fake, "sao", ".venv", "bin"), exist_ok=True)
    open(os.path.join(fake, "sao", ".venv", "bin", "activate"), "w").close()
    out = subprocess.run(["bash", "-c", f"set -euo pipefail; {cd}; pwd"], capture_output=True,
                         text=True, env={**os.environ, "HOME": fake}, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == os.path.join(fake, "sao")


def test_tpu_vm_sets_up_the_fleet_and_a_publish_location_it_can_read():
    lines = dry_run("tpu_vm.py", "--config=experiments/sao_math.py:qwen3_30b_a3b",
                    "--workdir=gs://bkt/runs/a", "--tpu=t1", "--fleet=f0,f1", "--servers_per_machine=1")
    for machine in ("f0", "f1"):
        setup = next(i for i, l in enumerate(lines) if f"ssh {machine} " in l and "sglang-real-venv" in l)
        start = next(i for i, l in enumerate(lines) if f"ssh {machine} " in l and "sglang_fleet.py" in l)
        assert setup < start and "make sglang-real-venv" in lines[setup]
        assert "gcsfuse --implicit-dirs" in lines[setup] and "bkt /mnt/sao-bucket" in lines[setup]
        assert "rollout.publish_root=/mnt/sao-bucket/runs/a/publish" in lines[start]
        assert '--sglang_python="$HOME/.cache/sao/sglang-0.5.23/bin/python"' in lines[start]
        assert "--model=/mnt/sao-bucket/models/base" in lines[start]
    assert "gcsfuse --implicit-dirs" in lines[1] and "--worker=all" in lines[1]  # the TPU hosts
    assert "'jax[tpu]" in lines[1] and "'.[gcs]'" in lines[1] and "python3.11 -m venv" not in lines[1]
    learner = next(l for l in lines if "--role=learner" in l)
    assert "rollout.publish_root=/mnt/sao-bucket/runs/a/publish" in learner
    assert "model.init=/mnt/sao-bucket/models/base" in learner
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "tpu_vm.py"),
                          "--config=experiments/sao_math.py:qwen3_30b_a3b", "--workdir=/local/run",
                          "--dry-run"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode != 0 and "gs://BUCKET" in out.stderr


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
    learner = next(l for l in lines if "--role=learner" in l)
    assert "rollout.tls_ca=$HOME/.sao/ca.pem" in learner and "tls_key" not in learner
    assert all("rollout.tls_key=$HOME/.sao/key.pem" in l for l in lines if "sglang_fleet.py" in l)


def test_dry_run_loads_and_checks_the_config():
    """A typo in --config or --set fails on --dry-run, with the reason, before anything is printed."""
    for script, extra in [("local.py", ("--workdir=/tmp/x",)),
                          ("sglang_fleet.py", ("--workdir=/tmp/x", "--model=/m")),
                          ("gpu_slurm.py", ("--workdir=/tmp/x",)), ("tpu_vm.py", ("--workdir=gs://b/x", "--fleet=f0"))]:
        out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", script),
                              "--config=experiments/quickstart.py", *extra,
                              "--set", "rollout.max_len=4096", "--dry-run"],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert out.returncode != 0 and out.stdout == "", (script, out.stdout)
        assert "rollout.max_len 4096" in out.stderr, (script, out.stderr[-2000:])
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "local.py"),
                          "--config=experiments/quickstart.py", "--workdir=/tmp/x",
                          "--set", "learner.no_such_key=1", "--dry-run"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode != 0 and "no_such_key" in out.stderr, out.stderr[-2000:]


def test_slurm_attach_and_tp():
    """--attach: no fleet component, one attached worker per URL on the first learner node;
    --tp: servers per node = GPUs // tp, each server on tp GPUs; the learner starts from --model."""
    lines = dry_run("gpu_slurm.py", "--config=experiments/sao_math.py:qwen3_8b", "--workdir=/shared/r",
                    "--model=/m", "--attach=http://a:1,http://b:2", "--worker_port=7000")
    text = "\n".join(lines)
    assert "hetjob" not in text and "--het-group" not in text
    assert "export SAO_WORKERS=127.0.0.1:7000,127.0.0.1:7001" in text
    assert "--attach=http://a:1,http://b:2" in text and "--config.model.init=/m" in text
    lines = dry_run("gpu_slurm.py", "--config=experiments/sao_math.py:qwen3_8b", "--workdir=/shared/r",
                    "--tp=4", "--no_install")
    fleet = next(l for l in lines if "launch/sglang_fleet.py" in l)
    assert "--servers=2 --tp=4 --gpus=8" in fleet and "pip install" not in "\n".join(lines)
    assert lines[-1] == "[local] sbatch /shared/r/sao.sbatch"
    script = [l for l in lines[:lines.index("[local] mkdir -p /shared/r")] if l]
    text = "\n".join(script)
    assert text.index("srun --het-group=0 --kill-on-bad-exit=1") < text.index('kill -TERM "$FLEET_PID"')
    assert script[-1] == 'exit "$status"'  # the learner's status, no bare wait holding the nodes


def test_tpu_vm_runtime_follows_the_accelerator_and_a_real_run_needs_repo(tmp_path):
    # A new user's box run created a v4-8 with v5p's runtime; and a real launch cloned a
    # placeholder URL. Both are refused or derived before any gcloud call (PATH is empty).
    base = ["--config=experiments/sao_math.py:qwen3_8b", "--workdir=gs://b/run", "--fleet=f0"]
    lines = dry_run("tpu_vm.py", *base, "--accelerator=v4-8")
    assert "--version=tpu-ubuntu2204-base" in lines[0]
    lines = dry_run("tpu_vm.py", *base, "--accelerator=v6e-8", "--runtime=custom-rt",
                    "--repo=https://example.org/sao.git")
    assert "--version=custom-rt" in lines[0] and "git clone https://example.org/sao.git" in lines[1]

    def refused(*args):
        out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "tpu_vm.py"), *base, *args],
                             capture_output=True, text=True, cwd=ROOT, timeout=300,
                             env={**os.environ, "PATH": str(tmp_path), "HOME": str(tmp_path)})
        assert out.returncode == 2, out.stderr
        return out.stderr
    assert "--runtime" in refused("--accelerator=v9x-8", "--dry-run")
    assert "--repo" in refused("--accelerator=v5p-64")
    assert not (tmp_path / ".sao").exists()                    # no token made either
