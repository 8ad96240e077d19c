"""README.md's "Full scale" commands, run as a user types them (``python`` from PATH, outside .venv).

Fast: the full-scale ``--dry-run`` commands, the model builder, a launcher
started by a Python without SAO's packages. The commands that train: the
Slurm and TPU VM launches in the box run in test_cluster_runs.py, from the
README's own text (their workers start SGLang's CPU engine and sglang-jax
servers); the one-machine fleet command runs as an argv, with free ports and
the checks' settings, with ``--attach`` on a real SGLang server
(tests/rollout/test_sglang_real_server.py).
"""
import shutil
import subprocess
import sys

from cluster import ROOT, in_tmp, readme_command, readme_commands, run_shell, user_env


def test_the_readme_block_is_what_the_tests_run():
    commands = readme_commands()
    assert sum(c.startswith("python launch/") for c in commands) == 8
    assert all(c.startswith(("python launch/", "export PATH=$PWD/launch/localcluster/bin:$PATH"))
               for c in commands)


def test_full_scale_dry_runs_print_their_commands():
    for c in [c for c in readme_commands() if c.endswith("--dry-run")]:
        out = run_shell(c, user_env(), timeout=300)
        assert out.returncode == 0 and out.stdout.strip(), (c, out.stderr[-2000:])
    slurm = run_shell(readme_command("gpu_slurm.py", "qwen3_8b"), user_env(), timeout=300).stdout
    assert "--tp=2" in slurm and "--servers=4" in slurm and "model.init=/shared/models/qwen3-8b" in slurm
    attach = run_shell(readme_command("--attach="), user_env(), timeout=300).stdout
    assert "--sglang_url=http://10.0.0.6:30000" in attach and "sglang.launch_server" not in attach


def test_a_launcher_outside_the_venv_runs_with_it_or_says_what_to_do(tmp_path):
    bare = subprocess.run(["bash", "-c", "command -v python3"], capture_output=True, text=True,
                          env=user_env()).stdout.strip()
    probe = subprocess.run([bare, "-c", "import absl"], capture_output=True, env=user_env())
    assert probe.returncode != 0, "the PATH python has SAO's packages: this test needs one without"
    out = subprocess.run([bare, "launch/local.py", "--config=experiments/quickstart.py",
                          f"--workdir={tmp_path}/r", "--dry-run"], cwd=ROOT, env=user_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "--role=learner" in out.stdout, out.stderr[-2000:]
    # Without a .venv beside it: a clear message (a copy of the launcher's package elsewhere).
    copy = tmp_path / "clone"
    shutil.copytree(ROOT / "launch", copy / "launch")
    out = subprocess.run([bare, str(copy / "launch" / "gpu_slurm.py"), "--config=x", "--workdir=/w"],
                         cwd=copy, env=user_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "make venv" in out.stderr and "Traceback" not in out.stderr


def test_the_model_builder_writes_a_model_directory(tmp_path):
    out = run_shell(in_tmp(readme_command("tiny_model.py"), tmp_path), user_env(), timeout=3600)
    assert out.returncode == 0, out.stderr[-2000:]
    model = tmp_path / "runs" / "tiny_qwen3"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in model.iterdir()}
    sys.path.insert(0, str(ROOT))
    from sao.models.tokenizer_loading import load_tokenizer
    assert load_tokenizer(str(model)).vocab_size > 500
