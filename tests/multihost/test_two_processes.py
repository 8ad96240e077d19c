"""A multi-host learner on this CPU: 2 processes x 4 devices (jax.distributed on
localhost, gloo CPU collectives) run ``python -m sao.main --role=all`` against a
local fleet, checkpoint every step, are SIGKILLed after step 2, resume, and
finish step 3. The processes run docs/multihost.md's example command, with
this test's overrides appended. Their parameters equal, bit for bit, those of a 1-process
8-device learner fed the batches the two-process run recorded (``run.replay``).

The reference joins a one-process ``jax.distributed`` job (replay_child.py):
gloo sums in another order than XLA's in-process CPU collectives, so the same
collectives are compared.
"""
import os
import pathlib
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from sao import run_metrics
from sao.fleet.replay import read_batches

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS = 3
OVERRIDES = [  # the cpu variant, cut to seconds per step: B=8 over 8 devices, one worker
    "model.mesh.data=-1", "learner.batch_size=8", "rollout.num_workers=1",
    "rollout.max_concurrency=8", "rollout.engine_slots=8", "rollout.max_new_tokens=24",
    "rollout.max_turns=2", "critic.value_pretrain_steps=0", "critic.critic_warmup_steps=1",
    "eval.num_prompts=4", "eval.every=0", "sft.steps=0", "checkpoint.every=1",
    f"run.steps={STEPS}", "run.tensorboard=False", "run.progress=False"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def doc_argv(process_id: int, port: int, workdir: str) -> tuple[dict, list[str]]:
    """docs/multihost.md's two-process example, process ``process_id`` of it: its
    environment assignments and argv, with this test's port and work dir."""
    text = (pathlib.Path(ROOT) / "docs" / "multihost.md").read_text()
    block = text.split("On one machine (what the tests do)", 1)[1].split("```bash\n", 1)[1]
    block = block.split("```", 1)[0]
    line = block.split("; do\n", 1)[1].split(" &\n", 1)[0].replace("\\\n", " ")
    words = shlex.split(line.replace("$i", str(process_id)))
    n = words.index(".venv/bin/python")                  # VAR=value words come before it
    env = dict(w.split("=", 1) for w in words[:n])
    argv = [w.replace("127.0.0.1:8476", f"127.0.0.1:{port}").replace("runs/mp", workdir)
            for w in words[n:]]
    assert argv[0] == ".venv/bin/python" and f"--workdir={workdir}" in argv, argv
    return env, [sys.executable, *argv[1:]]


def start_job(workdir: str, logs: str) -> list[subprocess.Popen]:
    """Both learner processes (process 0 spawns the rollout worker), each in its own
    process group: docs/multihost.md's command (4 CPU devices each) with this test's
    overrides after it (later values win)."""
    port = free_port()
    procs = []
    for i in range(2):
        env, argv = doc_argv(i, port, workdir)
        argv += [*(f"--config.{o}" for o in OVERRIDES), "--config.run.record_batches=True"]
        with open(f"{logs}.p{i}.log", "w") as log:
            procs.append(subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env}, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)   # the learner and the worker it spawned
    for p in procs:
        p.wait()


def wait(procs, timeout_s: float, until=lambda: False) -> bool:
    """Waits for both to exit (True) or ``until()`` (False); kills them past the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if until():
            return False
        if all(p.poll() is not None for p in procs):
            return True
        time.sleep(1)
    kill(procs)
    raise TimeoutError("the two-process learner did not finish in time")


def logs_of(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def train_state(directory: str):
    """A checkpoint's train item as numpy (on this process's first device)."""
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with ocp.StandardCheckpointer() as c:
        meta = c.metadata(directory)
        tree = getattr(meta, "item_metadata", meta)
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=dev), tree)
        return jax.tree.map(np.asarray, c.restore(directory, target))


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_two_processes_resume_and_equal_one_process_replay(tmp_path):
    work, logs = str(tmp_path / "mp"), str(tmp_path / "mp")
    # 1. Two processes train, checkpoint every step; SIGKILL once step 2 is saved.
    procs = start_job(work, logs + "-a")
    saved2 = lambda: os.path.isdir(os.path.join(work, "ckpt", "2"))  # noqa: E731 (renamed when complete)
    try:
        finished = wait(procs, 1200, until=saved2)
    finally:
        kill(procs)
    assert not finished, logs_of(logs + "-a.p0.log")[-3000:] + logs_of(logs + "-a.p1.log")[-3000:]
    # 2. Both resume from the same checkpoint and finish.
    procs = start_job(work, logs + "-b")
    try:
        wait(procs, 1200)
    finally:
        kill(procs)
    out = [logs_of(f"{logs}-b.p{i}.log") for i in range(2)]
    assert [p.returncode for p in procs] == [0, 0], out[0][-3000:] + out[1][-3000:]
    resumed = [re.findall(rf"process {i}: resumed at step (\d+) \(policy version (\d+)\)", out[i])
               for i in range(2)]
    assert resumed[0] == resumed[1] and len(resumed[0]) == 1 and int(resumed[0][0][0]) >= 2
    # Process 0 alone evaluated and wrote the run's records.
    assert "held-out pass@1" in out[0] and "held-out pass@1" not in out[1]
    assert "SAO run summary" in out[0] and "SAO run summary" not in out[1]
    rl = {r["step"] for r in run_metrics.read_metrics(work) if r["phase"] == "rl"}
    start = int(resumed[0][0][0])   # a step saved but killed before its record has none
    assert {0, *range(start + 1, STEPS + 1)} <= rl <= set(range(STEPS + 1))
    batches = list(read_batches(os.path.join(work, "replay.bin")))
    assert [b.step for b in batches] == list(range(STEPS)) and all(
        len(b.trajectories) == 8 for b in batches)
    # 3. One process, 8 devices, the recorded batches.
    ref = str(tmp_path / "ref")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "replay_child.py"), str(free_port()),
                           ref, os.path.join(work, "replay.bin"), *OVERRIDES],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"reference steps {STEPS}" in proc.stdout
    # 4. Same parameters, optimiser moments and counters, bit for bit.
    two = train_state(os.path.join(work, "ckpt", str(STEPS), "train"))
    one = train_state(os.path.join(ref, "ckpt", str(STEPS), "train"))
    assert jax.tree.structure(two) == jax.tree.structure(one)
    leaves = list(zip(jax.tree.leaves(two), jax.tree.leaves(one)))
    assert len(leaves) > 50
    for a, b in leaves:
        np.testing.assert_array_equal(a, b)
    before = train_state(os.path.join(ref, "ckpt", str(STEPS - 1), "train"))
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(one)))
