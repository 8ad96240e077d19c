"""The launcher's one-machine fleet run (``launch/sglang_fleet.py ... --learner``) and the
checks every SGLang fleet run shares; used by tests/rollout/test_sglang_real_server.py
(real SGLang servers attached by URL, this module's ``launch``) and by the TPU VM box run
of tests/launch/test_cluster_runs.py (sglang-jax servers its fleet's workers start and
restart on every push). What the checks assert: check_run's docstring.
"""
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
for _path in (ROOT, ROOT / "tests" / "rollout", ROOT / "tests" / "launch"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from cluster import free_ports, left_running, tagged_env  # noqa: E402
from sao import run_metrics  # noqa: E402
from sao.ckpt import hf_dir  # noqa: E402
from sao.fleet.replay import read_batches  # noqa: E402
from sao.models import from_pretrained, token_logprobs  # noqa: E402
from sao.models.tokenizer_loading import load_tokenizer  # noqa: E402
from sao.rollout.sglang_server import READY_LINE, START_MARK  # noqa: E402
from xla_flags import cpu_devices  # noqa: E402

STEPS = 2


def launch(model: str, workdir: pathlib.Path, *server_flags: str, servers: int = 2) -> float:
    """Runs the launcher's command (``servers`` workers) to the end; returns its wall time (s)."""
    argv = [sys.executable, "launch/sglang_fleet.py", "--config=experiments/sao_math.py:fleet_cpu",
            f"--workdir={workdir}", f"--model={model}", f"--servers={servers}", "--device=cpu",
            f"--python={sys.executable}", f"--sglang_port={free_ports(2)}",
            f"--worker_port={free_ports(2)}", *server_flags, "--learner",
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
                      "XLA_FLAGS": cpu_devices(1)}, box_dir)
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


def check_run(workdir: pathlib.Path, model: str, servers: int = 2) -> dict:
    """The checks of a finished fleet run, whatever its servers; returns numbers to print.

    * each step's DIS ratio at lag 0: ``max |log pi_learner - log pi_server|`` <= 1e-3
      over every action token (``actor/max_abs_log_ratio``, ``batch/staleness_max`` 0;
      the parity gate's per-token bound: f32 log-probs of requests the server batched
      differently reached 1.1e-4 once in a loaded fresh clone, 2026-12-04; weights that
      are not the learner's differ by ~3.4 nats), and
      independently, from the recorded batches (``run.record_batches``), the log-probs our
      model recomputes from each published HF export equal the server's on the tokens that
      version sampled;
    * the log-prob parity gate (on by default) passed every server at every version;
    * the weights really change: the kept HF exports differ, the actor's gradient is non-zero;
    * Hermes tool calls ran in the sandbox (a ``<tool_call>`` whose program's output came
      back framed in the trajectory);
    * evaluation through the fleet before RL, every ``eval.every`` steps and after, on
      ``eval.num_prompts`` held-out prompts (the run's ``config.json``); ``summary.json``.
    """
    cfg = json.loads((workdir / "config.json").read_text())
    every, prompts = cfg["eval"]["every"], cfg["eval"]["num_prompts"]
    eval_steps = sorted({0, STEPS} | {s for s in range(1, STEPS + 1) if every and s % every == 0})
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
    assert max(gaps) <= 1e-3, gaps
    # The log-prob parity gate (on by default) checked every server at every version and
    # passed it: the ChatML probe holds the model's last id, which SGLang reports as 0.
    for s, r in rl.items():
        passed = {k: v for k, v in r.items() if k.startswith("parity/") and k.endswith("/passed")}
        assert len(passed) == servers and set(passed.values()) == {1}, r
        assert r["parity/failures"] == 0 and r["fleet/quarantined"] == 0
        assert max(v for k, v in r.items() if k.endswith("/mean_gap")) < 1e-4
    # Evaluation through the fleet: before, during and after; sampled apart.
    evals = [r for r in records if "eval/accuracy" in r]
    assert sorted(r["step"] for r in evals) == eval_steps
    assert all(r["eval/prompts"] == prompts and r["eval/missing"] == 0 for r in evals)
    during = [s for s in eval_steps if 0 < s < STEPS]     # sampled before the last record
    assert rl[STEPS]["fleet/sampled"] == prompts * len(during), rl[STEPS]
    assert rl[STEPS]["fleet/trained"] == 4 * STEPS
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
    (at temperature 1), with our model loaded from the HF export ``hf``. One forward
    of all of them, end-padded to one length (causal: padding after a sequence
    changes none of its log-probs; one shape, so one compilation per run)."""
    _, model, _ = from_pretrained(hf)
    length = 128 * -(-max(len(t.tokens) for t in trajs) // 128)
    seqs = np.zeros((len(trajs), length), np.int32)
    for i, t in enumerate(trajs):
        seqs[i, :len(t.tokens)] = np.asarray(t.tokens, np.int32)
    ours = np.asarray(token_logprobs(model, seqs, temperature=1.0))
    worst = 0.0
    for i, t in enumerate(trajs):
        acts = np.asarray(t.action_mask, bool)
        got = ours[i, :len(t.tokens)][acts]
        worst = max(worst, float(np.abs(got - np.asarray(t.rollout_logprobs)[acts]).max()))
    return worst
