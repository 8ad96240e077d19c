"""End to end: ``python -m sao.main --config=experiments/sao_swe.py:{smollm2_cpu,cpu}``.

* ``smollm2_cpu``: SmolLM2-135M-Instruct in one JaxEngine rollout worker
  process; **mini-swe-agent, unmodified**, runs every episode against the
  worker's endpoint (the run's token), its bash commands in the sandboxed
  workspace of a micro-tier repository task; 2 learner steps of 2
  trajectories each through the gRPC fleet, held-out
  evaluation on the fleet before and after the steps.
* ``cpu``: the tiny byte-level model, the reference harness stepping
  ``SweEnv`` through the endpoint, an SFT warm start on the scripted fixes of
  the micro tier's training tasks (2 SFT steps here), 2 learner steps.

Checked on each run: the summary and every step's fleet counters (all
trajectories trained, none dropped, no episode lost to an error), and the
trajectories buffered in the final checkpoint: they came through the
endpoint (its counters in their metadata; no history cut, except the flagged cut of a
rewrite by mini-swe-agent), every action
token was sampled by a pushed policy version, observations are unmasked
and, for mini-swe-agent, the prompt is exactly the chat-template rendering
of mini-swe-agent's own first two messages with its ``bash`` tool. SmolLM2
is not asked to solve the tasks. Durations are printed (``pytest -s``).
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from sao import run_metrics  # noqa: E402
from xla_flags import cpu_devices  # noqa: E402


def buffered_trajectories(workdir: str):
    """Trajectories in the dispatcher state of the run's latest checkpoint (its JSON item only)."""
    import base64

    import orbax.checkpoint as ocp
    from sao.rpc import codec

    with ocp.CheckpointManager(os.path.join(workdir, "ckpt")) as manager:
        meta = manager.restore(manager.latest_step(), args=ocp.args.Composite(
            meta=ocp.args.JsonRestore()))["meta"]
    state = (meta["data_state"] or {}).get("dispatcher") or {}
    return [codec.decode(base64.b64decode(b)) for b in state.get("buffer", [])]


def run(config, workdir, *overrides, timeout=3300):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": cpu_devices(1)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sao.main", f"--config={config}",
                           f"--workdir={workdir}", "--config.run.progress=False", *overrides],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    logs = ""
    wdir = os.path.join(workdir, "workers")
    if proc.returncode and os.path.isdir(wdir):
        logs = "".join(open(os.path.join(wdir, f)).read()[-2000:] for f in os.listdir(wdir))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs
    with open(os.path.join(workdir, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    steps = [r for r in run_metrics.read_metrics(workdir)
             if r["phase"] == "rl" and "learner/step" in r]
    return summary, steps, wall


def check_fleet(summary, steps, batch, n_steps=2):
    assert (summary["steps"], summary["trajectories"], summary["dropped"]) == \
        (n_steps, n_steps * batch, 0)
    assert [r["step"] for r in steps] == list(range(1, n_steps + 1))
    for r in steps:
        assert r["batch/num_rows"] == float(batch), r
        assert r["fleet/episode_errors"] == 0.0 and r["fleet/dropped"] == 0.0, r


def check_endpoint_trajectories(trajs, vocab_size, *, harness_may_rewrite=False):
    """Token-in/token-out trajectories of the endpoint. A real harness may rewrite its
    history (mini-swe-agent answers SmolLM2's replies without a tool call with a format
    error in place of the reply): such an episode is cut at the first difference, flagged
    ``cut: history_rewrite``, and ends with the harness's error; nothing is re-tokenised."""
    assert trajs, "no buffered trajectory in the final checkpoint"
    for t in trajs:
        if harness_may_rewrite and "cut" in t.metadata:
            assert t.metadata["cut"] == "history_rewrite" and "harness_error" in t.metadata, \
                t.metadata
        else:
            assert "endpoint_end" in t.metadata and "cut" not in t.metadata, t.metadata
        assert t.metadata["turns"] >= 1 and t.action_mask[-1]
        assert int(np.min(t.policy_version[t.action_mask])) >= 0
        assert np.all(t.rollout_logprobs[~t.action_mask] == 0.0)
        assert int(np.max(t.tokens)) < vocab_size


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_mini_swe_agent_drives_smollm2_through_the_fleet(tmp_path):
    from experiments import sao_swe
    from sao import components
    from sao.fleet.endpoint.dialect import dialect_for
    from sao.fleet.endpoint.messages import Message, ToolSpec
    from sao.fleet.endpoint.mswea import SYSTEM_TEMPLATE
    from minisweagent.models.utils.actions_toolcall import BASH_TOOL

    workdir = str(tmp_path / "run")
    # The config's 2 learner steps (the acceptance of the agentic-coding issue): the second
    # trains on episodes sampled by pushed version 1.
    # One held-out prompt before and after (the config's 2 cost ~40 CPU-s more, same checks).
    summary, steps, wall = run("experiments/sao_swe.py:smollm2_cpu", workdir,
                               "--config.eval.num_prompts=1")
    check_fleet(summary, steps, batch=2)
    assert summary["policy_version"] == 2
    cfg = sao_swe.get_config("smollm2_cpu")
    tok = components.make_tokenizer(cfg)
    records = {r["prompt_id"]: r for t in components.make_tasks(cfg).values() for r in t.records()}
    trajs = buffered_trajectories(workdir)
    check_endpoint_trajectories(trajs, tok.vocab_size, harness_may_rewrite=True)
    dialect = dialect_for(tok)
    for t in trajs:
        assert "exit_status" in t.metadata or "harness_error" in t.metadata, t.metadata
        want = tok.encode(dialect.prompt_text(
            [Message("system", SYSTEM_TEMPLATE), Message("user", records[t.prompt_id]["text"])],
            [ToolSpec("bash", BASH_TOOL)]))
        assert t.tokens[:len(want)].tolist() == want
        assert not t.action_mask[:len(want)].any() and t.action_mask[len(want)]
    print(f"\nsao_swe smollm2_cpu: wall {wall:.0f} s, {len(trajs)} buffered, exits "
          f"{[t.metadata.get('exit_status', t.metadata.get('endpoint_end')) for t in trajs]}, "
          f"turns {[t.metadata['turns'] for t in trajs]}")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_cpu_variant_micro_tier_two_steps(tmp_path):
    workdir = str(tmp_path / "run")
    summary, steps, wall = run("experiments/sao_swe.py:cpu", workdir, "--config.run.steps=2",
                               "--config.sft.steps=2", "--config.critic.value_pretrain_steps=0",
                               "--config.eval.num_prompts=2", "--config.eval.samples_per_prompt=2",  # k > 1 on the fleet
                               "--config.learner.batch_size=4")
    check_fleet(summary, steps, batch=4)
    assert os.path.exists(os.path.join(workdir, "sft", "result.json"))
    check_endpoint_trajectories(buffered_trajectories(workdir), 272)
    print(f"\nsao_swe cpu: wall {wall:.0f} s, pass@1 before/after "
          f"{summary['accuracy_before']} / {summary['accuracy_after']}")
