"""The cluster in a box itself, and the launchers' refusals before any cloud call.

Fast: the shims run small bash scripts (no SAO); the refusals run the launchers
for real (no --dry-run) against the box and check its call log stays empty.
"""
import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from cluster import JAX_PYTHON, REAL_PYTHON, ROOT, SHIMS, box, box_env


def sh(cmd: str, env: dict, cwd, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_slurm_job_runs_its_script_per_node_and_reports_leftovers(tmp_path):
    env = box_env(tmp_path / "box")
    (tmp_path / "job.sh").write_text("\n".join([
        "#!/bin/bash", "#SBATCH --job-name=t --time=00:01:00", "#SBATCH --nodes=2 --ntasks-per-node=1",
        "#SBATCH --output=out-%j.txt", "#SBATCH hetjob", "#SBATCH --nodes=1", "set -euo pipefail",
        'scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0"',
        "srun --het-group=0 bash -c 'echo task $SLURM_PROCID of $SLURM_STEP_NUM_NODES on $SLURMD_NODENAME'",
        "srun --het-group=1 sleep 300 &", "sleep 1", "exit 3", ""]))
    out = sh(f"sbatch --wait job.sh", env, tmp_path)
    assert out.returncode == 3 and out.stdout.strip() == "Submitted batch job 1", out.stderr
    text = (tmp_path / "out-1.txt").read_text()
    nodes = [line for line in text.splitlines() if line.startswith("127.")]
    assert len(nodes) == 2 and len(set(nodes)) == 2
    assert {f"task {k} of 2 on {nodes[k]}" for k in range(2)} <= set(text.splitlines())
    acct = sh("sacct -j 1 -n -P -o JobID,State,ExitCode", env, tmp_path)
    assert acct.stdout.strip() == "1|FAILED|3:0"
    calls = box.calls(str(tmp_path / "box"))
    leftover = [c for c in calls if c.get("event") == "leftover"]
    assert len(leftover) == 1 and any("sleep 300" in p for p in leftover[0]["processes"].values())
    assert not box.tagged(str(tmp_path / "box"))                  # and they were ended
    assert [c["tool"] for c in calls if c["tool"] != "box"][:3] == ["sbatch", "scontrol", "srun"]


def test_a_deep_box_gives_its_nodes_a_tmpdir_that_holds_unix_sockets(tmp_path):
    # SGLang binds its ZMQ IPC endpoints in TMPDIR; a Unix socket path may not exceed
    # 107 bytes, and under pytest-xdist's temporary directories the node's own
    # <box>/slurm/job1/<node>/tmp left no room (a real SGLang server could not start).
    deep = tmp_path / ("d" * 60) / "box"
    env = box_env(deep)
    sock = "import os, socket; s = socket.socket(socket.AF_UNIX); " \
           "s.bind(os.path.join(os.environ['TMPDIR'], 'tmp0123456789abcdef-ipc')); " \
           "print('bound', os.environ['TMPDIR'], os.path.realpath(os.environ['TMPDIR']))"
    (tmp_path / "job.sh").write_text("\n".join([
        "#!/bin/bash", "#SBATCH --time=00:01:00", "#SBATCH --output=out-%j.txt", "set -euo pipefail",
        f"srun {shlex.quote(sys.executable)} -c {shlex.quote(sock)}", ""]))
    out = sh("sbatch --wait job.sh", env, tmp_path)
    text = (tmp_path / "out-1.txt").read_text()
    assert out.returncode == 0, text
    tmpdir, real = text.split("bound ", 1)[1].split()[:2]
    assert real == str(deep / "slurm" / "job1" / "127.1.1.1" / "tmp") and len(tmpdir) < 40
    assert not os.path.exists(tmpdir)           # the short link goes with the job


SETPROCTITLE_PYTHON = next((p for p in (JAX_PYTHON, REAL_PYTHON) if p.exists() and subprocess.run(
    [p, "-c", "import setproctitle"], capture_output=True).returncode == 0), None)


@pytest.mark.skipif(SETPROCTITLE_PYTHON is None, reason="no environment with setproctitle (make sglang-venv)")
def test_a_leftover_that_sets_its_process_title_is_found(tmp_path):
    """SGLang's scheduler and detokenizer call setproctitle, which by default writes over
    /proc/PID/environ, where the box's tag is: such a leftover must still be found and ended."""
    env = {**box_env(tmp_path / "box"), "SAO_LOCALCLUSTER_KILL_WAIT_S": "2"}
    title = ("import os, setproctitle, time; setproctitle.setproctitle('sglang::scheduler'); "
             "open('pid', 'w').write(str(os.getpid())); time.sleep(300)")
    (tmp_path / "job.sh").write_text("\n".join([
        "#!/bin/bash", "#SBATCH --time=00:01:00", f"{SETPROCTITLE_PYTHON} -c {shlex.quote(title)} &",
        "while [ ! -s pid ]; do sleep 0.2; done", ""]))
    out = sh("sbatch --wait job.sh", env, tmp_path)
    pid = int((tmp_path / "pid").read_text())
    try:
        assert out.returncode == 0, out.stderr
        leftover = [c for c in box.calls(str(tmp_path / "box")) if c.get("event") == "leftover"]
        assert [list(c["processes"].values()) for c in leftover] == [["sglang::scheduler"]]
        assert not box.tagged(str(tmp_path / "box")) and not box._alive(pid)   # and it was ended
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def test_scancel_and_time_limit_end_a_job(tmp_path):
    env = box_env(tmp_path / "box")
    (tmp_path / "long.sh").write_text("#!/bin/bash\n#SBATCH --time=05:00\nsrun sleep 300\n")
    (tmp_path / "short.sh").write_text("#!/bin/bash\n#SBATCH --time=00:03\nsrun sleep 300\n")
    assert sh("sbatch long.sh && sbatch short.sh", env, tmp_path).returncode == 0
    deadline = time.monotonic() + 30
    while "127." not in sh("squeue -h", env, tmp_path).stdout and time.monotonic() < deadline:
        time.sleep(0.2)
    sh("scancel 1", env, tmp_path)
    while sh("squeue -h", env, tmp_path).stdout.strip() and time.monotonic() < deadline + 30:
        time.sleep(0.5)
    states = sh("sacct -j 1,2 -n -P -o JobID,State", env, tmp_path).stdout.split()
    assert states == ["1|CANCELLED", "2|TIMEOUT"]
    assert not box.tagged(str(tmp_path / "box"))


def test_tpu_vm_hosts_scp_and_delete(tmp_path):
    env = box_env(tmp_path / "box")
    (tmp_path / "f.txt").write_text("hi")
    g = "gcloud compute tpus tpu-vm"
    out = sh(f"{g} create t --zone=z --accelerator-type=v4-16 --version=v && "
             f"{g} ssh t --zone=z --worker=all --command='mkdir -p .sao' && "
             f"{g} scp f.txt t:.sao/ --zone=z --worker=all && "
             f"{g} ssh t --zone=z --worker=all --command='echo $TPU_WORKER_ID $HOSTNAME $(cat .sao/f.txt) "
             f"$XLA_FLAGS; (sleep 300 >/dev/null 2>&1 &)'", env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == [
        f"{k} t-w-{k} hi --xla_force_host_platform_device_count=4" for k in range(2)]
    assert len(box.tagged(str(tmp_path / "box"), "tpu:t")) == 2
    assert sh(f"{g} delete t --zone=z --quiet", env, tmp_path).returncode == 0
    assert not box.tagged(str(tmp_path / "box"))
    assert sh(f"{g} ssh t --zone=z --command=true", env, tmp_path).returncode != 0  # gone
    assert sh("gcloud compute instances create x", env, tmp_path).returncode == 2  # not simulated


def launch(script: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "launch" / script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("script, args, reason", [
    ("tpu_vm.py", ("--config=experiments/sao_math.py:qwen3_30b_a3b", "--workdir=gs://b/r", "--fleet="),
     "--fleet is empty"),
    ("tpu_vm.py", ("--config=experiments/sao_math.py:qwen3_30b_a3b", "--workdir=gs://b/r", "--fleet=f0",
                   "--accelerator=v5p-8", "--set", "model.mesh.expert=8"), "found 4"),
    ("tpu_vm.py", ("--config=experiments/sao_math.py:qwen3_30b_a3b", "--workdir=gs://b/r", "--fleet=f0"),
     "--repo: the git URL"),   # a real launch would clone nothing on every machine
    ("gpu_slurm.py", ("--config=experiments/sao_math.py:qwen3_30b_a3b", "--workdir={w}",
                      "--learner_nodes=1", "--gpus_per_node=6"), "found 6"),
    ("gpu_slurm.py", ("--config=experiments/sao_math.py:qwen3_8b", "--workdir={w}", "--tp=3",
                      "--servers_per_node=3"), "3 servers x --tp 3 need 9 GPUs; a fleet node has 8"),
    ("sglang_fleet.py", ("--config=experiments/sao_math.py:qwen3_8b", "--workdir={w}", "--model=/m",
                         "--servers=8", "--gpus=8", "--learner"), "8 servers x --tp 1 + the learner need 9"),
    ("sglang_fleet.py", ("--config=experiments/sao_math.py:qwen3_8b", "--workdir={w}", "--model=/m",
                         "--servers=2", "--tp=4", "--gpus=8"), "need 8 GPUs; 8 here"),
])
def test_refused_before_any_cloud_call(tmp_path, script, args, reason):
    env = box_env(tmp_path / "box")
    workdir = tmp_path / "run"
    out = launch(script, env, *(a.format(w=workdir) for a in args))
    if "need 8 GPUs; 8 here" in reason:  # the control: 2 x 4 = 8 fits (a fleet, no learner, dry run)
        out = launch(script, env, *(a.format(w=workdir) for a in args), "--dry-run")
        assert out.returncode == 0, out.stderr
        return
    assert out.returncode != 0 and reason in out.stderr, out.stderr[-2000:]
    assert box.calls(str(tmp_path / "box")) == [] and not workdir.exists()


def test_set_values_arrive_intact_in_the_script(tmp_path):
    """The sbatch script's learner command, run by bash as srun would, gives sao.main each
    --set value exactly (spaces, both quotes, parentheses, $, backslash, glob)."""
    value = """a b "c" 'd' (e) $HOME $(x) `y` \\z *"""
    out = launch("gpu_slurm.py", box_env(tmp_path / "box"), "--config=experiments/sao_math.py:qwen3_8b",
                 f"--workdir={tmp_path}/r", "--set", f"name={value}", "--dry-run")
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if "--het-group=0" in l)
    learner = line.split(" bash -c ", 1)[1].rsplit(" || status=$?", 1)[0]
    # bash reads the srun line's word (what srun gets), then runs it with sao.main's argv printed.
    inner = subprocess.run(["bash", "-c", f"printf %s {learner}"], capture_output=True, text=True,
                           timeout=30).stdout
    probe = "import sys, json; print(json.dumps(sys.argv[1:]))"
    assert '".venv/bin/python" -m sao.main ' in inner
    inner = inner.replace('".venv/bin/python" -m sao.main', f"{sys.executable} -c {shlex.quote(probe)}")
    got = subprocess.run(["bash", "-c", inner], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "SAO_WORKERS": "w:1", "SAO_COORDINATOR": "c:2",
                              "SLURM_STEP_NUM_NODES": "1", "SLURM_PROCID": "0"})
    argv = json.loads(got.stdout)
    assert f"--config.name={value}" in argv and "--config.rollout.worker_addresses=w:1" in argv
