"""The fleet feeding the project learner (SAO update on a tiny model):
replay reproduces its parameters bit for bit, and a stream full of corrupt
and malformed trajectories leaves it training with finite parameters."""
import jax
import numpy as np
import pytest
from flax import nnx

from sao.fleet import sim
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
from sao.fleet.local import ThreadedWorker
from sao.fleet.replay import Recorder, ReplaySource
from sao.fleet.worker import WorkerConfig
from sao.learner import LearnerConfig, make_train_batch
from sao.learner.learner import Learner
from sao.learner.mesh import mesh_from_config
from sao.models import Transformer, get_preset
from sao.rpc import codec

from .helpers import VOCAB, good_trajectory, prompts
from .test_faults import FakeLink

pytestmark = pytest.mark.slow  # compiles the learner's steps (~15 s of CPU)

B = 4
CFG = LearnerConfig(batch_size=B, length_buckets=(64,), critic_warmup_steps=1,
                    actor_lr=1e-2, critic_lr=1e-2, shard_check="off")
MODEL = get_preset("tiny", hidden_size=64, intermediate_size=128, num_heads=2, num_kv_heads=1,
                   num_layers=1)


@pytest.fixture(scope="module")
def learner():
    mesh = mesh_from_config({"data": 1}, devices=jax.devices()[:1])
    return Learner(CFG, mesh, lambda: Transformer(MODEL, rngs=nnx.Rngs(0)))


def host(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def train(learner, source, max_steps):
    """The RL loop (sao.rl_loop) in miniature: batch, update, publish, push."""
    states = learner.init_states()
    for _ in range(max_steps):
        batch = source.get_batch(timeout=60)
        if not batch:
            break
        tb = make_train_batch(batch, buckets=CFG.length_buckets, batch_size=B, pad_id=CFG.pad_id)
        states, metrics = learner.update(states, tb)
        version = states.policy_version
        source.push_weights(version, f"mem://{version}")
    return states, metrics


def test_replay_reproduces_update_bit_identically(learner, tmp_path):
    # Log-probs near a uniform policy's (-ln 272 = -5.6) keep ratios in the DIS band.
    def make():
        engine = sim.SimulatedEngine(seconds_per_token=2e-4, logprob_range=(-5.8, -5.4))
        return engine, sim.make_sim_episode_fn(engine)

    ps = sim.lognormal_prompts(40, median=20, sigma=0.8, seed=7, max_len=50)
    cfg = DispatcherConfig(batch_size=B, vocab_size=VOCAB, tau=2)
    with ThreadedWorker(make, WorkerConfig()) as w, Dispatcher([w.address], ps, cfg) as d:
        rec = Recorder(d, tmp_path / "replay.bin")
        live, metrics = train(learner, rec, max_steps=4)
        rec.close()
    assert metrics["learner/actor_updated"] == 1.0 and live.policy_version == 3
    replayed, _ = train(learner, ReplaySource(tmp_path / "replay.bin"), max_steps=4)
    fresh = learner.init_states()
    assert any(not np.array_equal(a, b) for a, b in zip(host(live.actor.params),
                                                        host(fresh.actor.params)))
    for a, b in zip(host(live), host(replayed)):
        assert a.tobytes() == b.tobytes()


def test_corrupt_stream_leaves_learner_finite(learner):
    rng = np.random.default_rng(0)
    n = 60
    d = Dispatcher([], prompts(n), DispatcherConfig(batch_size=B, vocab_size=VOCAB, tau=1000))
    link = FakeLink("fuzz")
    d.link_joined(link, 1000, None)
    corrupt = [
        lambda t: t.rollout_logprobs.__setitem__(-1, np.nan),
        lambda t: t.rollout_logprobs.__setitem__(-1, 2.0),
        lambda t: t.tokens.__setitem__(-1, VOCAB + 1),
        lambda t: t.policy_version.__setitem__(-1, 5),
        lambda t: t.action_mask.__setitem__(slice(None), False),
        lambda t: setattr(t, "reward", np.inf),
        lambda t: t.rollout_logprobs.__setitem__(-1, -1e30),   # valid, but an extreme ratio
    ]
    for i in range(n):
        lease = link.leases.popleft()
        t = good_trajectory(lease.prompt_id, 4, int(rng.integers(1, 40)), reward=float(i % 2))
        kind = i % 4
        if kind == 1:
            corrupt[int(rng.integers(len(corrupt)))](t)
        data = codec.encode(t)
        if kind == 2:  # flipped bytes
            data = bytearray(data)
            for pos in rng.integers(0, len(data), 3):
                data[pos] = int(rng.integers(256))
            data = bytes(data)
        link.answer(d, lease, data=data)
    states, metrics = train(learner, d, max_steps=n)
    m = d.snapshot()
    assert m["trained"] + m["dropped"] == n and m["dropped"] > 0 and m["trained"] >= 2 * B
    assert all(np.all(np.isfinite(x)) for x in host(states))
    assert metrics["learner/actor_updated"] == 1.0
    assert all(np.isfinite(v) for v in metrics.values())
