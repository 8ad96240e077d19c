"""The full-scale path on this CPU, through the launcher's own command.

    python launch/sglang_fleet.py --config=experiments/sao_math.py:fleet_cpu --workdir=W \\
        --model=M --servers=2 --backend=jax --device=cpu --sglang_python=.venv-sglang/bin/python \\
        --learner --set rollout.tau=0 ...

(``--backend=torch --sglang_python=<make sglang-real-venv's python>`` for the
real SGLang server). M is a small Qwen3 (head_dim 128) written by our HF
exporter with an HF tokenizer and taught to call the Python tool in Hermes
format (launch/tiny_model.py). The launcher starts two rollout workers,
each starting and supervising its own SGLang server, and the learner: held-out
evaluation and value-pretraining samples through the fleet, then 2 SAO steps
(critic and actor) with ``tau=0``, so every token the learner trains on was
sampled by the weights of that step, and every publish (orbax params + HF
export) pushed to both workers.

Checked on the finished run:
* every push was reloaded by both servers: sglang-jax restarts (one start per
  version v0..v2 in each server's log), SGLang ``/update_weights_from_disk``
  (one start, then one ``update_weights`` per later version);
* the log-prob parity gate (on by default) passed both servers at every
  version (records ``parity/<server>/passed``, mean gap < 1e-4);
* each step's DIS ratio at lag 0: ``max |log pi_learner - log pi_server|`` <= 1e-4
  over every action token (``actor/max_abs_log_ratio``, ``batch/staleness_max`` 0),
  and independently, from the recorded batches (``run.record_batches``), the
  log-probs our model recomputes from each published HF export equal the
  server's on the tokens that version sampled;
* the weights really change: the kept HF exports (v0, v1, v2) differ (checksums),
  the actor's gradient is non-zero (the run adds a 0.001 entropy bonus: with
  the zero-initialised value head, a run whose episodes all score 0 would
  otherwise have all-zero advantages and push unchanged weights);
* Hermes tool calls ran in the sandbox: recorded trajectories hold a
  ``<tool_call>`` whose program's output came back framed in the trajectory;
* evaluation through the fleet: before, during (step 1, on the run's
  dispatcher: sampled, never trained) and after RL; ``summary.json``.
* the launcher exits on its own and leaves nothing running: every process it
  started carries the cluster box's tag (tests/launch/cluster.py), and none is
  alive 10 s after it returns (this is also README's one-machine command,
  tests/launch/test_cluster_runs.py runs the Slurm and TPU VM launchers).
Timings and the log-prob gaps are printed (``pytest -s``); docs/rollout.md
records them.
"""
import hashlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "rollout"))
sys.path.insert(0, str(ROOT / "tests" / "launch"))

from cluster import left_running, tagged_env  # noqa: E402
from launch import tiny_model  # noqa: E402
from sglang_real import PYTHON as REAL_PYTHON, needs_real_sglang  # noqa: E402
from sao import run_metrics  # noqa: E402
from sao.ckpt import hf_dir  # noqa: E402
from sao.fleet.replay import read_batches  # noqa: E402
from sao.models import from_pretrained, token_logprobs  # noqa: E402
from sao.models.tokenizer_loading import load_tokenizer  # noqa: E402
from sao.rollout.sglang_server import READY_LINE, START_MARK  # noqa: E402

JAX_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
STEPS = 2
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


def free_base_port(n: int) -> int:
    """A port p with p .. p + n - 1 free on 127.0.0.1 a moment ago."""
    rng = np.random.default_rng()
    for _ in range(200):
        base = int(rng.integers(20000, 60000))
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def launch(model: str, workdir: pathlib.Path, *server_flags: str) -> float:
    """Runs the launcher's command to the end; returns its wall time (s)."""
    argv = [sys.executable, "launch/sglang_fleet.py", "--config=experiments/sao_math.py:fleet_cpu",
            f"--workdir={workdir}", f"--model={model}", "--servers=2", "--device=cpu",
            f"--python={sys.executable}", f"--sglang_port={free_base_port(2)}",
            f"--worker_port={free_base_port(2)}", *server_flags, "--learner",
            "--set", "rollout.tau=0", "--set", f"run.steps={STEPS}",
            "--set", "run.progress=False", "--set", "run.record_batches=True",
            "--set", "eval.every=1",   # before, during (step 1) and after
            # The value head starts at zero and the tiny model earns a reward in ~15% of
            # episodes: a run whose 16 episodes all score 0 has every advantage exactly 0
            # and pushes unchanged weights. A small entropy bonus moves the actor at every
            # step whatever the rewards, so each push carries new weights.
            "--set", "learner.entropy_coef=0.001"]
    box_dir = workdir.parent / "box"   # every process the launch starts carries its tag
    env = tagged_env({**os.environ, "JAX_PLATFORMS": "cpu",
                      "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}, box_dir)
    t0 = time.monotonic()
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400)
    wall = time.monotonic() - t0
    left = left_running(box_dir)     # workers, servers and their children stopped on their own
    logs = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                   for p in sorted((workdir / "workers").glob("*.log")))
    assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-5000:]}{logs}"
    assert not left, left
    return wall


def server_starts(workdir: pathlib.Path, i: int) -> tuple[list[str], str]:
    """The model paths worker ``i``'s server was started on and became ready on, and its
    whole log. A start that never got ready (the worker's ``ready_timeout_s`` passed on a
    loaded machine; the push is then retried) must be followed by a start of the same
    model: it is left out, and any other failed start fails the test."""
    log = (workdir / "workers" / f"sglang{i}.log").read_text(errors="replace")
    segments = log.split(START_MARK)[1:]
    paths = [seg.split("--model-path ", 1)[1].split()[0] for seg in segments]
    ready = [READY_LINE in seg for seg in segments]
    for k, ok in enumerate(ready):
        assert ok or (k + 1 < len(paths) and paths[k + 1] == paths[k]), \
            f"start {k} on {paths[k]} never got ready and was not retried:\n{segments[k][-2000:]}"
    return [p for p, ok in zip(paths, ready) if ok], log


def check_run(workdir: pathlib.Path, model: str) -> dict:
    """The checks of the module doc that both servers share; returns numbers to print."""
    summary = json.loads((workdir / run_metrics.SUMMARY_FILE).read_text())
    assert summary["steps"] == STEPS and summary["policy_version"] == STEPS
    assert summary["trajectories"] == 4 * STEPS and summary["dropped"] == 0
    records = run_metrics.read_metrics(str(workdir))
    rl = {r["step"]: r for r in records if r["phase"] == "rl" and "learner/step" in r}
    assert sorted(rl) == list(range(1, STEPS + 1))
    gaps = [rl[s]["actor/max_abs_log_ratio"] for s in sorted(rl)]
    for s, r in rl.items():
        assert r["batch/staleness_max"] == 0 and r["learner/actor_updated"] == 1
        assert r["actor/grad_norm"] > 0
    assert max(gaps) <= 1e-4, gaps
    # The log-prob parity gate (on by default) checked both servers at every version and
    # passed them: the ChatML probe holds the model's last id, which SGLang reports as 0.
    for s, r in rl.items():
        passed = {k: v for k, v in r.items() if k.startswith("parity/") and k.endswith("/passed")}
        assert len(passed) == 2 and set(passed.values()) == {1}, r
        assert r["parity/failures"] == 0 and r["fleet/quarantined"] == 0
        assert max(v for k, v in r.items() if k.endswith("/mean_gap")) < 1e-4
    # Evaluation through the fleet: before, during (step 1) and after; sampled apart.
    evals = [r for r in records if "eval/accuracy" in r]
    assert sorted(r["step"] for r in evals) == [0, 1, STEPS]
    assert all(r["eval/prompts"] == 4 and r["eval/missing"] == 0 for r in evals)
    assert rl[STEPS]["fleet/sampled"] == 4 and rl[STEPS]["fleet/trained"] == 4 * STEPS
    # The weights change at every step: the published exports differ.
    publish = workdir / "publish"
    versions = sorted(p.name for p in publish.iterdir() if p.name.startswith("v"))
    digests = {v: hashlib.sha256((publish / v / "hf" / "model.safetensors").read_bytes()).hexdigest()
               for v in versions}
    assert len(versions) == min(STEPS + 1, 3) and len(set(digests.values())) == len(versions), digests
    # Recorded batches: lag 0, tool calls through the sandbox, log-probs of each export.
    tok = load_tokenizer(str(publish / versions[-1] / "hf"))  # the export carries it
    assert tok.vocab_size == load_tokenizer(model).vocab_size
    batches = list(read_batches(workdir / "replay.bin"))
    assert [b.learner_version for b in batches] == list(range(STEPS))
    ran, recomputed_gaps = 0, []
    for b in batches:
        for t in b.trajectories:
            acts = np.asarray(t.action_mask, bool)
            assert set(np.asarray(t.policy_version)[acts]) == {b.learner_version}
            ran += int(tool_call_ran(t, tok))
        uri = publish / f"v{b.learner_version:010d}" / "params"
        if uri.parent.exists():  # the 3 newest versions are kept
            recomputed_gaps.append(recomputed_gap(hf_dir(str(uri)), b.trajectories))
    assert ran > 0, "no Hermes tool call ran in the sandbox"
    kept = {int(v[1:]) for v in versions}
    assert len(recomputed_gaps) == len(kept & set(range(STEPS))) >= 1, recomputed_gaps
    assert max(recomputed_gaps) <= 1e-4, recomputed_gaps
    return {"gaps": gaps, "recomputed_gaps": recomputed_gaps, "tool_calls_ran": ran,
            "wall_s": summary["wall_s"]}


def tool_call_ran(traj, tok) -> bool:
    """A Hermes call whose program ran: the env counted no error, and the framed
    output the trajectory holds is what the program prints."""
    meta = traj.metadata
    if not meta.get("tool_calls") or meta.get("tool_errors", 0) >= meta["tool_calls"]:
        return False
    first_action = int(np.argmax(np.asarray(traj.action_mask, bool)))
    text = tok.decode([int(i) for i in traj.tokens[first_action:]])  # after the prompt
    for block in text.split("<tool_call>")[1:]:
        try:
            code = json.loads(block.split("</tool_call>", 1)[0])["arguments"]["code"]
        except (ValueError, KeyError, TypeError):
            continue  # a malformed call: the env answered with an error
        printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 timeout=30).stdout.strip()
        if printed and f"<tool_response>\n{printed}\n</tool_response>" in text:
            return True
    return False


def recomputed_gap(hf: str, trajs) -> float:
    """max |server log-prob - our log-prob| over the action tokens of ``trajs``
    (at temperature 1), with our model loaded from the HF export ``hf``."""
    _, model, _ = from_pretrained(hf)
    worst = 0.0
    for t in trajs:
        seq = np.asarray(t.tokens, np.int32)[None]
        ours = np.asarray(token_logprobs(model, seq, temperature=1.0))[0]
        acts = np.asarray(t.action_mask, bool)
        worst = max(worst, float(np.abs(ours[acts] - np.asarray(t.rollout_logprobs)[acts]).max()))
    return worst


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


@pytest.mark.slow
@pytest.mark.sglang
@pytest.mark.timeout(2700)
@needs_real_sglang
def test_real_sglang_fleet_run_updates_weights_from_disk(model_dir, tmp_path):
    workdir = tmp_path / "run"
    wall = launch(model_dir, workdir, "--backend=torch", f"--sglang_python={REAL_PYTHON}")
    facts = check_run(workdir, model_dir)
    for i in range(2):
        starts, log = server_starts(workdir, i)
        assert [pathlib.Path(p).parent.name for p in starts] == ["v0000000000"]  # no restart
        assert log.count("Start update_weights") == STEPS  # v1 .. v2 from disk
    print(f"\nreal SGLang fleet: {wall:.0f} s for the command (learner {facts['wall_s']:.0f} s), "
          f"max |log ratio| per step {facts['gaps']}, recomputed {facts['recomputed_gaps']}, "
          f"{facts['tool_calls_ran']} tool calls ran")
