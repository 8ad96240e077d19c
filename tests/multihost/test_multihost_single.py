"""sao.multihost and sao.lead_sampling in one process (no-ops that must keep the
data), the broadcast message format, and the replay cut on resume."""
import numpy as np
import pytest

from sao import multihost, run_metrics
from sao.fleet.replay import ReplayWriter, read_batches
from sao.lead_sampling import LeadSampling
from sao.types import Trajectory


def trajs(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(5, 40))
        mask = rng.random(length) < 0.5
        out.append(Trajectory(tokens=rng.integers(0, 300, length).astype(np.int32), action_mask=mask,
                              rollout_logprobs=np.where(mask, rng.normal(size=length), 0.0)
                              .astype(np.float32),
                              policy_version=np.full(length, i, np.int32), reward=float(i) / 3,
                              finish="stop", prompt_id=f"p{i}", trajectory_id=f"t{i}",
                              metadata={"num_tool_calls": i, "task": "x"}, epoch=1, group=0))
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for f in ("tokens", "action_mask", "rollout_logprobs", "policy_version"):
            np.testing.assert_array_equal(getattr(x, f), getattr(y, f))
        assert (x.reward, x.finish, x.prompt_id, x.trajectory_id, x.metadata, x.epoch) == \
               (y.reward, y.finish, y.prompt_id, y.trajectory_id, y.metadata, y.epoch)


def test_message_round_trip_is_exact():
    batch = trajs(7)
    got, err = multihost.decode_message(multihost.encode_message(batch))
    assert err == "" and got[0].rollout_logprobs.dtype == np.float32
    assert_same(got, batch)
    assert multihost.decode_message(multihost.encode_message(None, "TimeoutError: x")) == (
        [], "TimeoutError: x")
    assert multihost._bucket(1) == 4096 and multihost._bucket(5000) == 8192


def test_one_process_is_a_pass_through():
    batch = trajs(3)
    assert multihost.is_lead() and multihost.process_count() == 1
    assert multihost.broadcast_trajectories(batch) == batch
    assert multihost.broadcast_bytes(b"abc") == b"abc"
    assert multihost.broadcast_json({"a": 1}) == {"a": 1}
    multihost.sync("nothing")
    tree = {"w": np.arange(4.0)}
    np.testing.assert_array_equal(multihost.gather_to_host(tree)["w"], tree["w"])
    with pytest.raises(multihost.LeadError, match="fleet stalled"):
        multihost.broadcast_trajectories(None, "fleet stalled")

    def failing(timeout):
        raise TimeoutError("no batch in 5 s")
    with pytest.raises(TimeoutError, match="no batch"):
        multihost.BatchBroadcast(failing)(5.0)
    assert multihost.BatchBroadcast(lambda t: batch)(1.0) == batch
    follower = multihost.FollowerSource()
    assert follower.push_weights(3, "uri") == {} and follower.learner_version == 3
    assert follower.snapshot() == {}


class _Sampler:
    def __init__(self):
        self.calls = []

    def sample(self, states, prompts, temperature=None):
        self.calls.append(("sample", states, temperature))
        return trajs(len(prompts))

    def pass_at_1(self, states, prompts, temperature):
        self.calls.append(("pass_at_1", states, temperature))
        return {"eval/accuracy": 0.5}


def test_lead_sampling_with_one_process_is_the_sampler():
    inner = _Sampler()
    sampling = LeadSampling(inner, in_process=True, publish=lambda s, v: "")
    assert len(sampling.sample("S", [{}, {}], temperature=0.5)) == 2
    assert sampling.pass_at_1("S", [{}], 1.0) == {"eval/accuracy": 0.5}
    assert inner.calls == [("sample", "S", 0.5), ("pass_at_1", "S", 1.0)]


def test_null_writer_keeps_nothing(tmp_path):
    with run_metrics.NullWriter() as w:
        assert w.write(3, {"a/b": 1.0})["step"] == 3


def test_replay_writer_cuts_back_to_the_resumed_step(tmp_path):
    path = tmp_path / "replay.bin"
    with ReplayWriter(path) as w:
        for step in range(4):
            w.write_batch(trajs(2, seed=step), learner_version=step)
    with ReplayWriter(path, max_batches=2) as w:       # resumed from the step-2 checkpoint
        assert w.steps == 2
        w.write_batch(trajs(2, seed=9), learner_version=7)
    got = list(read_batches(path))
    assert [(b.step, b.learner_version) for b in got] == [(0, 0), (1, 1), (2, 7)]
    assert_same(got[2].trajectories, trajs(2, seed=9))
    with ReplayWriter(path, max_batches=10) as w:      # more than there are: all kept
        assert w.steps == 3
