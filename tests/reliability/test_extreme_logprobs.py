"""S5: an extreme rollout log-prob cannot void a GRPO step silently.

At ingest a log-prob below ``sao.types.MIN_ROLLOUT_LOGPROB`` is dropped with
``logprob_out_of_range`` (through a real worker server and dispatcher). A
batch that still makes the update non-finite (here one built by hand, as a
replay file written before the bound would hold it) is reported: a warning
naming the cause, ``learner/nonfinite_skips`` = 1 in the step's metrics."""
import logging

import jax
import numpy as np
import pytest
from flax import nnx

from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
from sao.learner import LearnerConfig, make_train_batch
from sao.learner.learner import Learner
from sao.learner.mesh import mesh_from_config
from sao.models import Transformer, get_preset
from sao.types import MIN_ROLLOUT_LOGPROB, Trajectory

from .hostile import VOCAB, scripted_worker

B = 4


def test_implausible_rollout_logprobs_are_dropped_at_ingest():
    bad = [-1e30, -1e4, MIN_ROLLOUT_LOGPROB - 1]
    ps = [{"prompt_id": f"bad{i}", "length": 6, "logprob": lp} for i, lp in enumerate(bad)]
    ps += [{"prompt_id": f"ok{i}", "length": 6, "logprob": lp}
           for i, lp in enumerate([MIN_ROLLOUT_LOGPROB, -20.0, -0.5, 0.0, -3.0])]
    cfg = DispatcherConfig(batch_size=5, vocab_size=VOCAB, tau=100)
    with scripted_worker() as w, Dispatcher([w.address], ps, cfg) as d:
        trained = d.get_batch(timeout=30) + d.get_batch(timeout=30)
        m = d.snapshot()
    assert m["drops"] == {"logprob_out_of_range": 3}
    assert sorted(t.prompt_id for t in trained) == [f"ok{i}" for i in range(5)]


@pytest.fixture(scope="module")
def grpo_learner():  # compiles a GRPO actor step: ~15 s of CPU, ~50 s on a loaded 2-core box
    cfg = LearnerConfig(batch_size=B, length_buckets=(16,), advantage_estimator="grpo",
                        policy_loss="ppo_clip", eps_low=0.2, eps_high=0.28, actor_lr=1e-2,
                        shard_check="off")
    model = get_preset("tiny", hidden_size=32, intermediate_size=64, num_heads=2,
                       num_kv_heads=1, num_layers=1)
    mesh = mesh_from_config({"data": 1}, devices=jax.devices()[:1])
    return Learner(cfg, mesh, lambda: Transformer(model, rngs=nnx.Rngs(0)))


def _batch(extreme: float | None):
    trajs = []
    for i in range(B):  # two groups of two with different rewards: non-zero advantages
        lp = [0.0, 0.0, -2.0, -2.0, -2.0]
        if extreme is not None and i == 0:
            lp[2] = extreme
        trajs.append(Trajectory(tokens=[5, 6, 7, 8, 9], action_mask=[0, 0, 1, 1, 1],
                                rollout_logprobs=lp, policy_version=[0] * 5,
                                reward=float(i % 2), finish="stop", prompt_id=f"g{i // 2}",
                                trajectory_id=str(i)))
    return make_train_batch(trajs, buckets=(16,), batch_size=B, pad_id=0)


@pytest.mark.slow
def test_a_nonfinite_update_is_warned_with_its_cause_and_counted(grpo_learner, caplog):
    states = grpo_learner.init_states()
    states, m = grpo_learner.update(states, _batch(None))
    assert m["learner/nonfinite_skips"] == 0
    with caplog.at_level(logging.WARNING, logger="sao.learner.guards"):
        states, m = grpo_learner.update(states, _batch(-1e30))
    assert m["actor/skipped_nonfinite_loss"] + m["actor/skipped_nonfinite_grad"] == 1
    assert m["learner/nonfinite_skips"] == 1
    [record] = [r for r in caplog.records if "update skipped" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "importance ratio overflows" in record.getMessage() or "non-finite" in record.getMessage()
    assert np.isfinite(m["learner/step"])
