"""The launcher's one-machine fleet command (README's step 2) on this CPU, with sglang-jax
servers (``--backend=jax``):

    python launch/sglang_fleet.py --config=experiments/sao_math.py:fleet_cpu --workdir=W \\
        --model=M --servers=2 --backend=jax --device=cpu --sglang_python=.venv-sglang/bin/python \\
        --learner --set rollout.tau=0 ...

M is a small Qwen3 (head_dim 128) written by our HF exporter with an HF
tokenizer and taught to call the Python tool in Hermes format
(launch/tiny_model.py). The launcher starts two rollout workers, each
starting and supervising its own sglang-jax server, and the learner:
held-out evaluation through the fleet, then 2 SAO steps (critic and actor)
with ``tau=0``, so every token the learner trains on was sampled by the
weights of that step, and every publish (orbax params + HF export) pushed to
both workers. Checked: every push was reloaded by both servers by a restart
(one start per version v0..v2 in each server's log; sglang-jax has no
``/update_weights_from_disk``), and everything tests/e2e/fleet_run.py's
``check_run`` asserts (lag-0 log-prob equality, the parity gate, changing
weights, tool calls in the sandbox, evaluation before, during and after);
the launcher exits on its own and leaves nothing running (every process it
started carries the cluster box's tag, tests/launch/cluster.py). Real SGLang
servers run the same checks attached by URL (``--attach``) in
tests/rollout/test_sglang_real_server.py; the launcher starting real SGLang
servers itself runs in tests/launch/test_cluster_runs.py (Slurm, TPU VM).
Timings and the log-prob gaps are printed (``pytest -s``); docs/rollout.md
records them.
"""
import pathlib
import time

import pytest

from fleet_run import ROOT, STEPS, check_run, launch, server_starts
from launch import tiny_model

JAX_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
# sglang-jax on CPU for this model: one prefill and one decode shape to compile (sequences
# <= 384 tokens, 4 at once), compiled programs cached across the restarts of each reload.
JAX_SERVER_ARGS = ("--max-total-tokens 2048 --max-running-requests 4 "
                   "--precompile-token-paddings 512 --precompile-bs-paddings 4")


@pytest.fixture(scope="module")
def model_dir():
    t0 = time.monotonic()
    path = tiny_model.cached()  # built once per version of launch/tiny_model.py
    print(f"\ntiny Qwen3 ready in {time.monotonic() - t0:.0f} s")
    return path


@pytest.mark.slow
@pytest.mark.sglang
@pytest.mark.timeout(2700)
@pytest.mark.skipif(not JAX_PYTHON.exists(), reason=f"no {JAX_PYTHON} (`make sglang-venv`)")
def test_sglang_jax_fleet_run_restarts_on_every_push(model_dir, tmp_path):
    workdir = tmp_path / "run"
    wall = launch(model_dir, workdir, "--backend=jax", f"--sglang_python={JAX_PYTHON}",
                  f"--server_args={JAX_SERVER_ARGS}")
    facts = check_run(workdir, model_dir)
    for i in range(2):
        starts, _ = server_starts(workdir, i)
        assert [pathlib.Path(p).parent.name for p in starts] == \
            [f"v{v:010d}" for v in range(STEPS + 1)]  # v0 (first push), then one restart each
    print(f"\nsglang-jax fleet: {wall:.0f} s for the command (learner {facts['wall_s']:.0f} s), "
          f"max |log ratio| per step {facts['gaps']}, recomputed {facts['recomputed_gaps']}, "
          f"{facts['tool_calls_ran']} tool calls ran")
