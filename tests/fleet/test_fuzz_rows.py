"""Trajectory fuzzer: generated wire rows (fuzz_rows.py: every message field
and metadata key with wrong types, NaN / inf, huge, empty and negative
values) go through the real codec and dispatcher into learner steps, with a
checkpoint (the dispatcher's state as JSON) after every batch. No exception
anywhere; every row gets one outcome: trained exactly when no refusing fault
was applied, else dropped under a named reason, each counted once.

``make test`` runs a short budget (a few seconds); the full count (>= 10,000
rows, the project learner's SAO update, orbax checkpoints) is the slow test.
"""
import collections
import json
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
from sao.learner.batch import make_train_batch
from sao.rpc import sao_pb2

from . import fuzz_rows, tiny_learner
from .fuzz_rows import LEARNER_VERSION, MAX_ABS_REWARD, MAX_LENGTH, REASONS, VOCAB
from .test_faults import FakeLink

B = 4
CFG = DispatcherConfig(batch_size=B, vocab_size=VOCAB, tau=100, max_attempts=1,
                       initial_version=LEARNER_VERSION, max_length=MAX_LENGTH,
                       max_abs_reward=MAX_ABS_REWARD)
TOTALS = collections.Counter()


def run_rows(rows, step, checkpoint=None):
    """Answers one lease per row through ``link_response`` (the codec and the
    dispatcher's arrival path), trains every batch with ``step(batch)`` and
    round-trips the dispatcher's state after each; returns the snapshot."""
    d = Dispatcher([], [{"prompt_id": f"r{i}"} for i in range(len(rows))], CFG)
    link = FakeLink("fuzz")
    d.link_joined(link, len(rows) + 1, None)
    leases = {l.prompt_id: l.lease_id for l in link.leases}
    finished = [sao_pb2.Finished(lease_id=leases[f"r{i}"], trajectory=data)
                for i, (data, _, _) in enumerate(rows)]
    for i in range(0, len(finished), 7):  # several answers per response, as a worker packs them
        d.link_response(link, sao_pb2.GenerateResponse(finished=finished[i:i + 7],
                                                       worker_version=LEARNER_VERSION))
    trained = []
    while batch := d.get_batch(timeout=5):
        trained += batch
        step(batch)
        state = json.loads(json.dumps(d.state_dict(), allow_nan=False))
        if checkpoint is not None:
            state = checkpoint(state)
        Dispatcher([], [], CFG).load_state_dict(state)
    m = d.snapshot()
    expected = {f"r{i}" for i, (_, refused, _) in enumerate(rows) if not refused}
    got = {t.prompt_id for t in trained}
    assert got == expected, {f"r{i}": faults for i, (_, _, faults) in enumerate(rows)
                             if (f"r{i}" in got) != (f"r{i}" in expected)}
    assert m["trained"] == len(trained) and m["dropped"] == len(rows) - len(trained)
    assert set(m["drops"]) <= REASONS, set(m["drops"]) - REASONS
    TOTALS.update(rows=len(rows), trained=len(trained))
    TOTALS.update({f"drop/{k}": v for k, v in m["drops"].items()})
    return m


def tiny_step():
    params = [tiny_learner.init(VOCAB)]

    def step(batch):
        make_train_batch(batch, buckets=(MAX_LENGTH,), batch_size=B, pad_id=0)
        params[0] = tiny_learner.update(params[0], batch, batch_size=B)
        assert np.all(np.isfinite(np.asarray(params[0])))
    return step


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.lists(fuzz_rows.rows(), min_size=1, max_size=30))
def test_fuzzed_rows_short_budget(rows):
    run_rows(rows, tiny_step())


@pytest.mark.slow
def test_fuzzed_rows_ten_thousand_through_the_project_learner(tmp_path):
    """>= 10,000 rows into the SAO update of a tiny model, orbax checkpoints."""
    import jax
    from flax import nnx

    from sao.ckpt import Checkpointer, abstract_state
    from sao.learner import LearnerConfig
    from sao.learner.learner import Learner
    from sao.learner.mesh import mesh_from_config
    from sao.models import Transformer, get_preset

    cfg = LearnerConfig(batch_size=B, length_buckets=(MAX_LENGTH,), critic_warmup_steps=1,
                        shard_check="off", pad_id=0)
    model = get_preset("tiny", hidden_size=32, intermediate_size=64, num_heads=2,
                       num_kv_heads=1, num_layers=1)
    mesh = mesh_from_config({"data": 1}, devices=jax.devices()[:1])
    learner = Learner(cfg, mesh, lambda: Transformer(model, rngs=nnx.Rngs(0)))
    states = [learner.init_states()]

    def step(batch):
        tb = make_train_batch(batch, buckets=(MAX_LENGTH,), batch_size=B, pad_id=0)
        states[0], m = learner.update(states[0], tb)
        assert all(np.isfinite(v) for v in m.values() if isinstance(v, float)), m

    saver = Checkpointer(str(tmp_path / "ckpt"), async_save=False, max_to_keep=1)
    train = {"step": np.zeros((), np.int32)}
    n_ckpt = collections.Counter()

    def checkpoint(state):  # an orbax checkpoint every 50 batches, restored
        n_ckpt["batches"] += 1
        if n_ckpt["batches"] % 50:
            return state
        saver.save(n_ckpt["batches"], train_state=train, data_state={"dispatcher": state})
        return saver.restore(target=abstract_state(train)).data_state["dispatcher"]

    TOTALS.clear()
    t0 = time.perf_counter()

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck),
              database=None)
    @given(rows=st.lists(fuzz_rows.rows(), min_size=36, max_size=50))
    def fuzz(rows):
        run_rows(rows, step, checkpoint)

    fuzz()
    saver.close()
    elapsed = time.perf_counter() - t0
    print(f"fuzzed {TOTALS['rows']} rows ({TOTALS['trained']} trained) in {elapsed:.0f} s; "
          f"drops {dict(sorted((k, v) for k, v in TOTALS.items() if k.startswith('drop/')))}")
    assert TOTALS["rows"] >= 10_000
