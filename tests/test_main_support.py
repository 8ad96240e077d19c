"""A tiny end-to-end run of ``python -m sao.main``, made once per test session.

Shared by tests/test_main.py (the run, its summary, resume) and
tests/notebooks (the analysis notebook executed on its output).
"""
import functools
import os
import subprocess
import sys
import tempfile
from xla_flags import cpu_devices  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Everything tiny: 2 SFT steps, 8-trajectory batches, 2 worker processes, 8 held-out prompts.
TINY = ["--config.sft.steps=2", "--config.sft.batch_size=8", "--config.sft.num_demos=64",
        "--config.learner.batch_size=8", "--config.train.value_pretrain_trajectories=8",
        "--config.critic.value_pretrain_steps=2", "--config.critic.critic_warmup_steps=1",
        "--config.eval.num_prompts=8", "--config.eval.every=1", "--config.env.task_size=200",
        "--config.data.heldout_fraction=0.2", "--config.rollout.max_concurrency=8",
        "--config.rollout.engine_slots=8", "--config.checkpoint.every=1",
        "--config.run.progress=False"]


def run_main(workdir: str, steps: int, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": cpu_devices(1)}
    argv = [sys.executable, "-m", "sao.main", "--config=experiments/quickstart.py",
            f"--workdir={workdir}", *TINY, f"--config.run.steps={steps}", *extra]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


@functools.lru_cache(maxsize=None)
def tiny_run() -> tuple[str, subprocess.CompletedProcess]:
    """``(workdir, completed process)`` of a 2-step quick-start run."""
    workdir = tempfile.mkdtemp(prefix="sao-tiny-run-")
    return workdir, run_main(workdir, 2)
