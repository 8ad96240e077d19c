"""Hostile and faulty workers, round two: each hole found against the real
dispatcher and worker servers (docs/reliability.md, "Hostile workers, round
two"), one test each. Every test failed at commit 04f7491."""
import base64
import collections
import re
import time

import grpc
import numpy as np
import pytest

from sao import ckpt
from sao.ckpt import Checkpointer, abstract_state
from sao.evaluation import pass_at_1
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
from sao.fleet.worker import RolloutServicer
from sao.rl_loop import batch_metrics
from sao.rpc import auth, codec, credentials, sao_pb2, sao_pb2_grpc
from sao.envs.facts import env_metrics
from sao.types import Trajectory

from . import hostile
from .hostile import FORGED_REWARD, VOCAB, scripted_worker

DRIFT_OK = {"phase": 1, "learner_step": 3, "quality": 1.0, "style_ok": True}
# (metadata a worker sends, drop reason); the first three are the issue's.
BAD_METADATA = [
    ({"num_tool_calls": None}, "bad_metadata_num_tool_calls"),
    ({"phase": 1}, "bad_metadata_drift"),
    ({"tool_timeouts": "x"}, "bad_metadata_tool_timeouts"),
    ({"num_tool_calls": -2}, "bad_metadata_num_tool_calls"),
    ({"num_tool_calls": 10**30}, "bad_metadata_num_tool_calls"),
    ({"tool_timeouts": True}, "bad_metadata_tool_timeouts"),
    ({**DRIFT_OK, "quality": "yes"}, "bad_metadata_quality"),
    ({**DRIFT_OK, "learner_step": 2.5}, "bad_metadata_learner_step"),
    ({"truncated": ["max_turns"]}, "bad_metadata_truncated"),
]
GOOD_METADATA = [{"num_tool_calls": 2, "tool_timeouts": 1, "num_turns": 3}, DRIFT_OK, {},
                 {"task": "anything else", "num_tool_calls": 0}]


def _summaries(trajs):
    """What the learner computes from worker data (the RL loop, the drift env, evaluation)."""
    return {**batch_metrics(trajs, 0), **env_metrics(trajs), **pass_at_1(trajs)}


def _row(metadata, pid="p"):
    return Trajectory(tokens=[1, 2, 3], action_mask=[False, True, True],
                      rollout_logprobs=[0, -1, -1], policy_version=[0] * 3, reward=1.0,
                      finish="stop", prompt_id=pid, trajectory_id=pid, metadata=metadata)


def test_s1_summaries_never_raise_on_worker_metadata():
    for metadata, _ in BAD_METADATA:
        _summaries([_row(metadata), _row(DRIFT_OK)])


def test_s1_typed_metadata_is_dropped_on_arrival_with_its_reason():
    ps = [{"prompt_id": f"bad{i}", "length": 6, "metadata": m}
          for i, (m, _) in enumerate(BAD_METADATA)]
    ps += [{"prompt_id": f"good{i}", "length": 6, "metadata": m}
           for i, m in enumerate(GOOD_METADATA * 2)]
    cfg = DispatcherConfig(batch_size=4, vocab_size=VOCAB, tau=100)
    trained = []
    with scripted_worker() as w, Dispatcher([w.address], ps, cfg) as d:
        while batch := d.get_batch(timeout=30):
            _summaries(batch)
            trained += batch
        m = d.snapshot()
    assert m["drops"] == collections.Counter(r for _, r in BAD_METADATA)
    assert sorted(t.prompt_id for t in trained) == sorted(p["prompt_id"] for p in ps
                                                          if p["prompt_id"].startswith("good"))


def test_s1_checkpoint_holding_such_rows_resumes_with_them_dropped(tmp_path):
    cfg = DispatcherConfig(batch_size=4, vocab_size=VOCAB, tau=100)
    with scripted_worker() as w:
        ps = [{"prompt_id": f"p{i}", "length": 6} for i in range(12)]
        state = Dispatcher([], [], cfg).state_dict()
        # The buffer as commit 04f7491 saved it (base64 of the wire bytes): it
        # accepted these rows, so its checkpoints held them.
        state["buffer"] = [base64.b64encode(codec.encode(_row(m, f"old{i}"))).decode()
                           for i, (m, _) in enumerate(BAD_METADATA)]
        state["buffer"] += [base64.b64encode(codec.encode(_row({}, "old-good"))).decode()]
        train = {"step": np.zeros((), np.int32)}
        with Checkpointer(str(tmp_path), async_save=False) as saver:
            saver.save(1, train_state=train, data_state={"dispatcher": state})
            state = saver.restore(target=abstract_state(train)).data_state["dispatcher"]
        d = Dispatcher([w.address], ps, cfg)
        d.load_state_dict(state)
        assert d.snapshot()["drops"] == collections.Counter(r for _, r in BAD_METADATA)
        trained = []
        with d:
            while batch := d.get_batch(timeout=30):
                _summaries(batch)
                trained += batch
    assert sorted(t.prompt_id for t in trained) == sorted(["old-good"] + [p["prompt_id"] for p in ps])


@pytest.fixture
def token_run(tmp_path):
    security = credentials.load_security(token_file=credentials.ensure_token_file(str(tmp_path)))
    return security, tmp_path / "publish"


def test_s2_workers_load_only_published_versions_and_one_ahead_is_retired(token_run):
    security, root = token_run
    publish = lambda v: ckpt.publish(str(root), v, {"w": np.full(2, v, np.float32)})
    strict = scripted_worker(security=security, publish_root=str(root))  # as a run starts them
    loose = scripted_worker(security=security)  # built in code: no publish root to check
    cfg = DispatcherConfig(batch_size=4, vocab_size=VOCAB, tau=1, security=security)
    ps = [{"prompt_id": f"p{i}", "length": 6} for i in range(40)]
    md = auth.call_metadata(security)
    with strict, loose, Dispatcher([strict.address, loose.address], ps, cfg) as d:
        d.get_batch(timeout=30)
        uri1 = publish(1)
        assert d.push_weights(1, uri1) == {strict.address: 1, loose.address: 1}
        # A token holder: version learner+50 with the learner's own weights, or at its own place.
        with grpc.insecure_channel(strict.address) as ch:
            stub = sao_pb2_grpc.RolloutWorkerStub(ch)
            for uri in [uri1, str(root / f"v{51:010d}" / "params")]:
                r = stub.UpdateWeights(sao_pb2.UpdateWeightsRequest(version=51, uri=uri),
                                       metadata=md, timeout=10)
                assert not r.ok and "not published" in r.error and r.version == 1, r
        assert strict.engine.version == 1
        with grpc.insecure_channel(loose.address) as ch:  # nothing checks it there ...
            assert sao_pb2_grpc.RolloutWorkerStub(ch).UpdateWeights(
                sao_pb2.UpdateWeightsRequest(version=51, uri="mem://v1"), metadata=md,
                timeout=10).ok
        for v in range(2, 6):  # ... the dispatcher retires it on its next report; steps go on
            assert len(d.get_batch(timeout=30)) == 4
            d.push_weights(v, publish(v))
        m = d.snapshot()
    assert m["version_ahead"] >= 1 and m["quarantined"] == 1
    assert "ahead of the learner" in m["workers"][loose.address]["problem"]
    assert m["workers"][strict.address]["problem"] == "" and strict.engine.version == 5
    assert m["drops"].get("future_version", 0) <= 16  # at most what it held when retired


def test_s4_only_the_lease_holder_may_answer_and_ids_are_unguessable():
    hostile.STOLEN.clear()
    hostile.StealingServicer.forged.clear()
    honest = scripted_worker(seconds_per_token=0.05, servicer_cls=hostile.RecordingServicer,
                             max_concurrency=4)
    thief = scripted_worker(servicer_cls=hostile.StealingServicer, max_concurrency=4)
    cfg = DispatcherConfig(batch_size=4, vocab_size=VOCAB, tau=2)
    ps = [{"prompt_id": f"p{i}", "length": 6} for i in range(24)]
    trained = []
    with honest, thief, Dispatcher([honest.address, thief.address], ps, cfg) as d:
        while batch := d.get_batch(timeout=60):
            trained += batch
        m = d.snapshot()
    assert hostile.StealingServicer.forged  # the thief did answer the honest worker's leases
    assert all(t.reward != FORGED_REWARD for t in trained)
    assert m["drops"] == {"foreign_lease": len(hostile.StealingServicer.forged)}
    assert m["workers"][honest.address]["trajectories"] > 0  # the holder's answers taken
    assert sorted(t.prompt_id for t in trained) == sorted(p["prompt_id"] for p in ps)
    ids = hostile.STOLEN
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[A-Za-z0-9_-]{22}", i) for i in ids)


class HangingServicer(RolloutServicer):
    """Takes leases and never answers them, while staying connected."""

    async def _episode(self, lease):
        await __import__("asyncio").Event().wait()


def test_s6_leases_time_out_by_default_and_a_hung_worker_is_quarantined_at_tau_0():
    assert DispatcherConfig(batch_size=4, vocab_size=VOCAB).lease_timeout_s is not None
    good = scripted_worker(max_concurrency=8)
    hung = scripted_worker(servicer_cls=HangingServicer, max_concurrency=8)
    cfg = DispatcherConfig(batch_size=4, vocab_size=VOCAB, tau=0, lease_timeout_s=2.0)
    ps = [{"prompt_id": f"p{i}", "length": 6} for i in range(24)]
    trained = []
    with good, hung, Dispatcher([good.address, hung.address], ps, cfg) as d:
        # Both live before the first batch: a hung worker that joined after the last step
        # would never be leased to, and nothing would time out.
        deadline = time.monotonic() + 120
        while sum(w["live"] for w in d.snapshot()["workers"].values()) < 2:
            assert time.monotonic() < deadline, d.snapshot()["workers"]
            time.sleep(0.02)
        for step in range(1, 5):  # synchronous RL: a barrier per step
            batch = d.get_batch(timeout=60)
            assert len(batch) == 4
            trained += batch
            d.push_weights(step, f"mem://{step}")
        m = d.snapshot()
    assert m["quarantined"] == 1 and m["reissued"] >= 1
    assert "lease_timeout_s" in m["workers"][hung.address]["problem"]
    assert m["workers"][hung.address]["leases"] == 0 and not m["workers"][hung.address]["live"]
    assert len({t.prompt_id for t in trained}) == 16
