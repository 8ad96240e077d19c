"""The log-prob parity gate at work: the real dispatcher and real gRPC workers
serving ``JaxEngine``s (sao.fleet.parity).

The learner's model is a small policy whose final norm is scaled up so that
its next-token distributions are peaked like a trained model's (mean probe
log-prob about -8 nats; a random one is near uniform, where every mismatch
looks small). Measured on it: a server computing in bfloat16 differs by
~0.007 nats per token (passes the default threshold, 0.1), one with rope
theta 1e6 instead of 1e4 by ~0.24 (quarantined), as SmolLM2-135M does
(docs/fleet.md). A half-loaded server keeps the previous version's
weights in its second layer.
"""
import threading

import jax
import pytest
from flax import nnx

from sao import ckpt
from sao.envs.base import Env, StepResult
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig, FleetError
from sao.fleet.local import ThreadedWorker
from sao.fleet.parity import ParityGate
from sao.fleet.probe import ReferencePublisher, probe_sequences
from sao.fleet.worker import WorkerConfig, agent_episode_fn
from sao.models import Transformer, get_preset
from sao.models.tokenizer import ByteTokenizer
from sao.rollout import SamplingParams
from sao.rollout.jax_engine import JaxEngine

from .helpers import wait_until

TOK = ByteTokenizer()
CFG = get_preset("tiny", hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                 intermediate_size=128)
SAMPLING = SamplingParams(max_new_tokens=6, stop_token_ids=(TOK.eos_id,))


def policy(seed: int) -> Transformer:
    model = Transformer(CFG, rngs=nnx.Rngs(seed))
    model.final_norm.scale[...] = model.final_norm.scale[...] * 8.0     # peaked, as trained
    return model


class HeldEnv(Env):
    """One turn, reward 1; ``reset`` waits until ``release`` is set (None: at
    once), so a worker can be made to hold its leases."""

    def __init__(self, release: threading.Event | None):
        self.release = release

    def reset(self, prompt):
        if self.release is not None:
            self.release.wait(120)
        return prompt["text"]

    def step(self, action_text):
        return StepResult(None, done=True, reward=1.0)


class HalfLoadingEngine(JaxEngine):
    """A server whose loads of version >= 1 stop half way: its second layer
    keeps the weights it served before (a loader bug the gate must catch)."""

    async def load_weights(self, version, uri):
        old = self._params
        await super().load_weights(version, uri)
        if version >= 1:
            mixed = jax.tree.map(lambda x: x, self._params)   # a new State, same arrays
            mixed["layers"][1] = old["layers"][1]
            self._params = mixed


def worker(*, rope_theta=None, dtype=None, engine_cls=JaxEngine, release=None) -> ThreadedWorker:
    cfg = CFG.replace(**{k: v for k, v in (("rope_theta", rope_theta), ("dtype", dtype))
                         if v is not None})

    def make():
        engine = engine_cls(Transformer(cfg, rngs=nnx.Rngs(9)), max_slots=4, max_len=64,
                            version=-1)
        return engine, agent_episode_fn(engine, lambda: HeldEnv(release), TOK, SAMPLING,
                                        max_turns=1, max_total_tokens=64)
    return ThreadedWorker(make, WorkerConfig(max_concurrency=2))


def prompts(n):
    return [{"prompt_id": f"p{i}", "text": f"{i} + {i} ="} for i in range(n)]


@pytest.fixture
def learner(tmp_path):
    """``(gate, publish(version) -> uri)``: the learner's model, its publish
    directory and the gate its references go to (``ReferencePublisher``)."""
    gate = ParityGate(probe_sequences(TOK, tool_format="tags", max_len=64))
    models = [policy(0), policy(1), policy(2)]
    graphdef, _ = nnx.split(models[0])
    publish = ReferencePublisher(
        lambda params, version: ckpt.publish(str(tmp_path / "publish"), version, params),
        params_of=lambda params: params, model_of=lambda p: nnx.merge(graphdef, p), gate=gate)
    return gate, lambda v: publish(nnx.state(models[v % 3], nnx.Param), v)


def config(gate, tau=1):
    return DispatcherConfig(batch_size=2, vocab_size=TOK.vocab_size, tau=tau, parity=gate)


@pytest.mark.slow  # three engines of three configs to compile, three pushes
def test_matched_servers_pass_a_mismatched_one_is_quarantined_and_the_run_goes_on(learner):
    gate, publish = learner
    with worker() as good, worker(dtype="bfloat16") as bf16, worker(rope_theta=1e6) as rope:
        d = Dispatcher([good.address, bf16.address, rope.address], prompts(40), config(gate))
        d.push_weights(0, publish(0))                      # before start: synced as each joins
        with d:
            for version in (1, 2):
                assert len(d.get_batch(timeout=120)) == 2
                d.push_weights(version, publish(version))
            assert len(d.get_batch(timeout=120)) == 2
            snap = d.snapshot()
    p, workers = snap["parity"], snap["workers"]
    assert p[f"{good.address}/passed"] == 1 and p[f"{good.address}/version"] == 2
    assert p[f"{good.address}/mean_gap"] < 1e-4              # float32 on both sides
    assert p[f"{bf16.address}/passed"] == 1 and 1e-4 < p[f"{bf16.address}/mean_gap"] < 0.05
    assert p[f"{rope.address}/passed"] == 0 and p[f"{rope.address}/version"] == 0
    assert p[f"{rope.address}/mean_gap"] > gate.max_mean_gap
    assert p["failures"] == 1 and p["checks"] == 7          # start-up 3, then 2 x 2 pushes
    assert snap["quarantined"] == 1 and workers[rope.address]["trajectories"] == 0
    problem = workers[rope.address]["problem"]
    assert "log-prob parity" in problem and "rope settings" in problem and "dtype" in problem
    assert workers[good.address]["problem"] == "" and workers[bf16.address]["problem"] == ""


@pytest.mark.slow
def test_a_server_broken_by_a_push_loses_its_prompts_to_the_others(learner):
    gate, publish = learner
    release = threading.Event()  # the half-loading server's episodes wait for it
    with worker() as good, worker(engine_cls=HalfLoadingEngine, release=release) as half:
        # tau=8: room in the budget for both, whichever joins first
        d = Dispatcher([good.address, half.address], prompts(60), config(gate, tau=8))
        d.push_weights(0, publish(0))
        try:
            with d:
                wait_until(lambda: d.snapshot()["workers"][half.address]["leases"] > 0, 120)
                d.get_batch(timeout=120)
                before = d.snapshot()
                d.push_weights(1, publish(1))                      # its load stops half way
                after = d.snapshot()
                batches = [d.get_batch(timeout=120) for _ in range(2)]
                final = d.snapshot()
        finally:
            release.set()
    assert before["workers"][half.address]["leases"] == 2        # in flight on it at the push
    assert after["quarantined"] == 1 and after["workers"][half.address]["leases"] == 0
    assert after["reissued"] == before["reissued"] + 2          # its prompts went back
    assert after["parity"][f"{half.address}/passed"] == 0
    assert after["parity"][f"{half.address}/version"] == 1
    assert after["parity"][f"{good.address}/passed"] == 1
    assert all(len(b) == 2 for b in batches)                    # the run goes on
    assert final["workers"][half.address]["trajectories"] == 0
    assert "half loaded" in final["workers"][half.address]["problem"]


def test_a_fleet_of_mismatched_servers_stops_with_the_likely_causes(learner):
    gate, publish = learner
    with worker(rope_theta=1e6) as a, worker(rope_theta=1e6) as b:
        d = Dispatcher([a.address, b.address], prompts(8), config(gate))
        d.push_weights(0, publish(0))
        with d, pytest.raises(FleetError) as err:
            d.get_batch(timeout=120)
    message = str(err.value)
    assert a.address in message and b.address in message and "log-prob parity" in message
    for cause in ("tokenizer or chat template", "dtype", "rope settings",
                  "weights not loaded or half loaded"):
        assert cause in message
