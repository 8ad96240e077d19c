"""Hostile-worker probe (fuzz): a worker on real gRPC answers its leases with
malformed, NaN, over-long, absurd-reward and wrong-vocabulary trajectories,
wrong dtypes, lying shapes and raw garbage, in any mix. A real Dispatcher
(with the run's bounds: largest bucket, reward bound) feeds a learner side
that pads into its buckets, trains, checkpoints the dispatcher (JSON) and
records a replay after every batch. Nothing raises; every bad answer is
dropped with its reason and counted; every good one is trained and recorded."""
import collections
import itertools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from sao.fleet import sim
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
from sao.fleet.local import ThreadedWorker
from sao.fleet.replay import Recorder, read_batches
from sao.fleet.worker import RolloutServicer, WorkerConfig
from sao.learner.batch import make_train_batch
from sao.rpc import codec, sao_pb2

from . import tiny_learner
from .helpers import VOCAB, good_trajectory

B = 4
BUCKETS = (64, 256)
MAX_ABS_REWARD = 100.0
CODEC_REASONS = {"decode_error", "bad_dtype", "bad_shape", "bad_metadata"}


def _msg(pid, **kw):
    return codec.to_proto(good_trajectory(pid, **kw))


def _set(msg, **fields):
    for k, v in fields.items():
        if isinstance(v, sao_pb2.Array):
            getattr(msg, k).CopyFrom(v)
        else:
            setattr(msg, k, v)
    return msg


def _poke(msg, field, index, value):
    a = codec.decode_array(getattr(msg, field), codec.FIELD_DTYPES[field])
    a[index] = value
    getattr(msg, field).CopyFrom(codec.encode_array(a, codec.FIELD_DTYPES[field]))
    return msg


def _timing(msg, value):
    msg.timings["generate_s"] = value
    return msg


# kind -> (message for prompt ``pid``, drop reason or None for a good answer)
KINDS = {
    "ok": (lambda pid: _msg(pid), None),
    "ok_longest": (lambda pid: _msg(pid, n_prompt=250, n_action=6), None),  # = largest bucket
    "ok_reward_at_bound": (lambda pid: _msg(pid, reward=-MAX_ABS_REWARD), None),
    "nan_metadata": (lambda pid: _set(_msg(pid), metadata_json='{"acc": NaN}'), "bad_metadata"),
    "inf_metadata": (lambda pid: _set(_msg(pid), metadata_json='{"acc": 1e999}'), "bad_metadata"),
    "deep_metadata": (lambda pid: _set(_msg(pid), metadata_json='{"a":' * 900 + "1" + "}" * 900),
                      "bad_metadata"),
    "nan_timing": (lambda pid: _timing(_msg(pid), float("nan")), "bad_metadata"),
    "over_long": (lambda pid: _msg(pid, n_prompt=990, n_action=10), "too_long"),
    "one_too_long": (lambda pid: _msg(pid, n_prompt=251, n_action=6), "too_long"),
    "absurd_reward": (lambda pid: _msg(pid, reward=1e30), "reward_out_of_range"),
    "negative_absurd_reward": (lambda pid: _msg(pid, reward=-1e6), "reward_out_of_range"),
    "nan_reward": (lambda pid: _msg(pid, reward=float("nan")), "nonfinite_reward"),
    "wrong_vocab": (lambda pid: _poke(_msg(pid), "tokens", -1, VOCAB + 100), "bad_token_id"),
    "negative_token": (lambda pid: _poke(_msg(pid), "tokens", 0, -7), "bad_token_id"),
    "nan_logprob": (lambda pid: _poke(_msg(pid), "rollout_logprobs", -1, np.nan),
                    "nonfinite_logprob"),
    "future_version": (lambda pid: _poke(_msg(pid), "policy_version", -1, 2**30),
                       "future_version"),
    "bad_finish": (lambda pid: _set(_msg(pid), finish="exploded"), "bad_finish"),
    "wrong_dtype": (lambda pid: _set(_msg(pid), tokens=sao_pb2.Array(
        dtype="<i8", shape=[7], data=bytes(56))), "bad_dtype"),
    "lying_shape": (lambda pid: _set(_msg(pid), tokens=sao_pb2.Array(
        dtype="<i4", shape=[2**40], data=bytes(28))), "bad_shape"),
    "short_mask": (lambda pid: _set(_msg(pid), action_mask=codec.encode_array(
        np.ones(3, bool), codec.FIELD_DTYPES["action_mask"])), "length_mismatch"),
    "episode_error": (None, "episode_failed"),
}


class HostileServicer(RolloutServicer):
    """Answers each lease with the planned payload: a message kind or raw bytes."""

    plan: dict = {}

    async def _episode(self, lease):
        answer = self.plan[lease.prompt_id]
        if isinstance(answer, bytes):
            return sao_pb2.Finished(lease_id=lease.lease_id, trajectory=answer)
        if answer == "episode_error":
            return sao_pb2.Finished(lease_id=lease.lease_id, error="RuntimeError: boom")
        data = KINDS[answer][0](lease.prompt_id).SerializeToString()
        return sao_pb2.Finished(lease_id=lease.lease_id, trajectory=data)


@pytest.fixture(scope="module")
def hostile_worker():
    def make():
        engine = sim.SimulatedEngine(seconds_per_token=0.0)
        return engine, sim.make_sim_episode_fn(engine)
    with ThreadedWorker(make, WorkerConfig(max_concurrency=64),
                        servicer_cls=HostileServicer) as w:
        yield w


_runs = itertools.count()
GOOD = sorted(k for k, (_, reason) in KINDS.items() if reason is None)
answer = st.one_of(st.sampled_from(GOOD), st.sampled_from(sorted(set(KINDS) - set(GOOD))),
                   st.binary(max_size=300))  # about a third of the answers good


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(answers=st.lists(answer, min_size=1, max_size=40))
@example(answers=sorted(KINDS) + [b"", b"\x00garbage"])  # every kind at least once
def test_learner_survives_every_hostile_payload(hostile_worker, tmp_path, answers):
    run = next(_runs)
    pids = [f"r{run}-p{i}" for i in range(len(answers))]
    HostileServicer.plan.update(zip(pids, answers))
    cfg = DispatcherConfig(batch_size=B, vocab_size=VOCAB, tau=1000, max_attempts=1,
                           max_length=BUCKETS[-1], max_abs_reward=MAX_ABS_REWARD)
    params, trained = tiny_learner.init(VOCAB), []
    d = Dispatcher([hostile_worker.address], [{"prompt_id": p} for p in pids], cfg)
    source = Recorder(d, tmp_path / f"replay-{run}.bin")
    with d:
        while batch := source.get_batch(timeout=10):
            trained += batch
            make_train_batch(batch, buckets=BUCKETS, batch_size=B, pad_id=0)
            params = tiny_learner.update(params, batch, batch_size=B)
            assert np.all(np.isfinite(np.asarray(params)))
            state = json.loads(json.dumps(d.state_dict(), allow_nan=False))  # a checkpoint
            Dispatcher([], [], cfg).load_state_dict(state)
    source.close()

    m = d.snapshot()
    expected = collections.Counter(KINDS[a][1] for a in answers
                                   if not isinstance(a, bytes) and KINDS[a][1] is not None)
    garbage = sum(isinstance(a, bytes) for a in answers)
    good = {p for p, a in zip(pids, answers) if not isinstance(a, bytes) and KINDS[a][1] is None}
    drops = collections.Counter(m["drops"])
    assert ({r: n for r, n in drops.items() if r not in CODEC_REASONS}
            == {r: n for r, n in expected.items() if r not in CODEC_REASONS})
    assert all(drops[r] >= expected[r] for r in CODEC_REASONS)
    assert sum(drops[r] for r in CODEC_REASONS) == sum(expected[r] for r in CODEC_REASONS) + garbage
    assert {t.prompt_id for t in trained} == good and len(trained) == len(good)
    assert m["trained"] + m["dropped"] == len(answers) and m["prompts_in_flight"] == 0
    recorded = [t.prompt_id for b in read_batches(tmp_path / f"replay-{run}.bin")
                for t in b.trajectories]
    assert recorded == [t.prompt_id for t in trained]
