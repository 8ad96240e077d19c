"""SGLangEngine against the real SGLang server (PyTorch, CPU engine).

`make sglang-real-venv` installs ``sglang==0.5.23`` once per machine outside
the clone (tests/rollout/sglang_real.py). One server per module, started on
the tiny Qwen3 of launch/tiny_model.py (head_dim 128, a ChatML tokenizer
whose last id, ``</tool_response>``, is in the parity probe), serves every
test; each test loads its own weights first with ``/update_weights_from_disk``.

* Random Qwen3s of that shape published by `sao.ckpt.publish` with our HF
  exporter: the server's log-probs of the tokens it generated must equal
  our `token_logprobs`, and after an update to a second version they must
  follow the new weights.
* The log-prob parity gate through the real dispatcher and a gRPC worker
  over the server: the model's own weights pass; weights that are not the
  learner's (a random init: "weights not loaded") are quarantined and the
  run stops naming the likely causes.
* README's ``launch/sglang_fleet.py --attach URL`` on that server: a fleet
  run of 2 SAO steps with every check of tests/e2e/fleet_run.py, each push
  loaded from disk, the server left running (no server start of its own).
Timings are printed (``pytest -s``).
"""
import asyncio
import pathlib
import sys
import time

import numpy as np
import pytest
from flax import nnx

from sao.ckpt import hf_dir, publish
from sao.envs.base import Env, StepResult
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig, FleetError
from sao.fleet.local import ThreadedWorker
from sao.fleet.parity import ParityGate
from sao.fleet.probe import ReferencePublisher, probe_sequences
from sao.fleet.worker import WorkerConfig, agent_episode_fn
from sao.models import Transformer, from_pretrained, save_pretrained
from sao.rollout import SamplingParams
from sao.rollout.agent import chatml_tool_format
from sao.rollout.sglang_engine import SGLangEngine
from sao.rollout.sglang_server import process_group_alive
from sglang_real import needs_real_sglang, real_server
from sglang_jax import recomputed

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "e2e"))
from fleet_run import STEPS, check_run, launch  # noqa: E402
from launch import tiny_model  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.sglang, needs_real_sglang]


@pytest.fixture(scope="module")
def tiny():
    """``(model_dir, cfg, model, tokenizer)`` of launch/tiny_model.py's Qwen3 (cached)."""
    path = tiny_model.cached()
    return (path, *from_pretrained(path))


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    """The real SGLang CPU server on the tiny Qwen3, started once (its start time in
    ``server.start_s``); stopped at the end with its whole process group."""
    srv = real_server(tiny[0], log_path=str(tmp_path_factory.mktemp("sglang") / "server.log"),
                      ready_timeout_s=900)
    t0 = time.perf_counter()
    try:
        srv.start()
        srv.start_s = time.perf_counter() - t0
        yield srv
    finally:
        srv.stop()
    assert srv.proc.returncode is not None and not process_group_alive(srv.proc.pid)


def test_real_sglang_logprobs_match_and_update_weights_from_disk(tmp_path, tiny, server):
    _, cfg, _, tok = tiny
    models = [Transformer(cfg, rngs=nnx.Rngs(seed)) for seed in (0, 1)]
    uris = []
    for version, model in zip((1, 2), models):
        params = nnx.state(model, nnx.Param)
        uris.append(publish(str(tmp_path / "publish"), version, params,
                            hf_export=lambda p: save_pretrained(params, cfg, p, tok)))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, size=int(n)).tolist() for n in (5, 9, 17, 30)]
    eos = tok.eos_id
    cases = [(prompts[0], SamplingParams(temperature=1.0, max_new_tokens=60)),
             (prompts[1], SamplingParams(temperature=1.0, max_new_tokens=12,
                                         stop_token_ids=tuple(range(0, 256, 9)))),
             (prompts[2], SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12)),
             (prompts[3], SamplingParams(temperature=0.7, max_new_tokens=12)),
             (prompts[3], SamplingParams(temperature=0.7, max_new_tokens=12))]  # cached prefix
    timings = {"start_s": server.start_s}

    async def main(engine):
        assert await engine.health()
        await engine.load_weights(1, hf_dir(uris[0]))  # the server started on another model
        first = list(await asyncio.gather(*(engine.generate(p, sp) for p, sp in cases[:3])))
        for p, sp in cases[3:]:
            first.append(await engine.generate(p, sp))
        scores.append(await engine.score(prompts[1:]))  # prompts cached by now
        t0 = time.perf_counter()
        await engine.load_weights(2, uris[1])  # a publish uri: its hf/ is loaded
        timings["update_weights_from_disk_s"] = time.perf_counter() - t0
        second = await engine.generate(prompts[1], SamplingParams(max_new_tokens=12))
        scores.append(await engine.score(prompts[1:]))
        await engine.close()
        return first, second

    scores = []  # Engine.score (the parity gate's probe) before and after the update
    engine = SGLangEngine(server.base_url, version=0, timeout_s=120)
    first, second = asyncio.run(main(engine))
    errors = []
    for (prompt, sp), c in zip(cases, first):
        assert c.versions == [1] * len(c.tokens) and len(c.tokens) <= sp.max_new_tokens
        if c.finish_reason == "stop":
            assert c.tokens[-1] in sp.stop_token_ids + (eos,)
        ours = recomputed(models[0], prompt, c.tokens, sp.temperature)
        errors.append(float(np.abs(np.asarray(c.logprobs) - ours).max()))
    assert max(errors) <= 1e-4, f"max |server - ours| per request: {errors}"
    # The server labels tokens with the weight version it was given.
    assert second.versions == [2] * len(second.tokens)
    ours = recomputed(models[1], prompts[1], second.tokens, 1.0)
    old = recomputed(models[0], prompts[1], second.tokens, 1.0)
    gap = float(np.abs(np.asarray(second.logprobs) - ours).max())
    assert gap <= 1e-4 and float(np.abs(np.asarray(second.logprobs) - old).max()) > 1e-2
    score_gaps = []
    for model, scored in zip(models, scores):  # prompt log-probs: the learner's, per version
        for p, got in zip(prompts[1:], scored):
            assert got[0] == 0.0 and len(got) == len(p)
            score_gaps.append(float(np.abs(np.asarray(got[1:]) -
                                           recomputed(model, p[:1], p[1:], 1.0)).max()))
    assert max(score_gaps) <= 1e-4, score_gaps
    print(f"\nreal SGLang CPU: start {timings['start_s']:.1f} s, max |logp gap| "
          f"{max(errors):.2e} (v1) {gap:.2e} (v2), /update_weights_from_disk "
          f"{timings['update_weights_from_disk_s']:.3f} s")


class OneTurnEnv(Env):
    def reset(self, prompt):
        return prompt["text"]

    def step(self, action_text):
        return StepResult(None, done=True, reward=1.0)


def test_parity_gate_passes_the_real_server_and_quarantines_wrong_weights(tmp_path, tiny,
                                                                          server):
    """Version 0 is exported from the learner's own weights: the server's
    probe log-probs match (the ChatML probe holds id 567, the model's last,
    which the server reports as 0). Version 1's export holds other weights
    than the learner published: quarantined, and, as the only server, the
    run stops with the likely causes."""
    _, cfg, model, tok = tiny
    gate = ParityGate(probe_sequences(tok, tool_format="hermes", max_len=512))
    assert max(map(max, gate.sequences)) == cfg.vocab_size - 1
    graphdef, _ = nnx.split(model)
    params = nnx.state(model, nnx.Param)
    wrong = nnx.state(Transformer(cfg, rngs=nnx.Rngs(1)), nnx.Param)   # never loaded

    def export(version):
        served = params if version == 0 else wrong
        return lambda path: save_pretrained(served, cfg, path, tok)
    pub = ReferencePublisher(
        lambda p, version: publish(str(tmp_path / "publish"), version, p,
                                   hf_export=export(version)),
        params_of=lambda p: p, model_of=lambda p: nnx.merge(graphdef, p), gate=gate)
    sampling = SamplingParams(max_new_tokens=8)

    def make():
        engine = SGLangEngine(server.base_url, version=-1, timeout_s=120)
        return engine, agent_episode_fn(engine, OneTurnEnv, tok, sampling, max_turns=1,
                                        max_total_tokens=96,
                                        turn_format=chatml_tool_format(tok))

    prompts = [{"prompt_id": f"p{i}", "text": f"What is {i} + {i}?"} for i in range(40)]
    with ThreadedWorker(make, WorkerConfig(max_concurrency=2)) as w:
        d = Dispatcher([w.address], prompts,
                       DispatcherConfig(batch_size=2, vocab_size=cfg.vocab_size, tau=1,
                                        parity=gate))
        d.push_weights(0, pub(params, 0))             # synced and checked as it joins
        with d:
            assert len(d.get_batch(timeout=120)) == 2
            matched = d.snapshot()["parity"]
            d.push_weights(1, pub(params, 1))
            with pytest.raises(FleetError) as err:     # after what it had buffered, if any
                for _ in range(len(prompts)):
                    d.get_batch(timeout=120)
            after = d.snapshot()
    assert matched[f"{w.address}/passed"] == 1 and matched[f"{w.address}/version"] == 0
    assert matched[f"{w.address}/mean_gap"] < 1e-4 and matched[f"{w.address}/max_gap"] < 1e-3
    p = after["parity"]
    assert p[f"{w.address}/passed"] == 0 and p[f"{w.address}/version"] == 1
    assert p[f"{w.address}/mean_gap"] > gate.max_mean_gap and after["quarantined"] == 1
    message = str(err.value)
    assert w.address in message and "log-prob parity" in message
    assert "weights not loaded or half loaded" in message and "tokenizer" in message
    print(f"\nparity on the real SGLang server: matched mean |gap| "
          f"{matched[f'{w.address}/mean_gap']:.2e} (max {matched[f'{w.address}/max_gap']:.2e}), "
          f"wrong weights {p[f'{w.address}/mean_gap']:.3f} nats")


@pytest.mark.timeout(2700)
def test_real_sglang_server_attached_by_url_runs_the_fleet(tmp_path, tiny, server):
    """README's ``--attach URL,...``: the launcher's one-machine fleet (a worker and the
    learner, tests/e2e/fleet_run.py's command and checks) on this server, already
    running. The worker loads every push, v0 included, with ``/update_weights_from_disk``;
    the server is the user's: still running when the launcher, which stopped everything
    it started, returns. (Several URLs, one worker each: tests/launch/test_launch_dry_run.py.)"""
    model_dir = tiny[0]
    before = server.log_tail(10**9).count("Start update_weights")
    workdir = tmp_path / "run"
    wall = launch(model_dir, workdir, f"--attach={server.base_url}", servers=1)
    facts = check_run(workdir, model_dir, servers=1)
    assert server.running()
    loads = server.log_tail(10**9).count("Start update_weights") - before
    assert loads == STEPS + 1, loads                 # v0 .. v2 from disk, no restart
    assert not list((workdir / "workers").glob("sglang*.log"))   # no server of the worker's own
    print(f"\nreal SGLang, attached: server up in {server.start_s:.0f} s, {wall:.0f} s for "
          f"the command (learner {facts['wall_s']:.0f} s), max |log ratio| per step "
          f"{facts['gaps']}, recomputed {facts['recomputed_gaps']}, "
          f"{facts['tool_calls_ran']} tool calls ran")
