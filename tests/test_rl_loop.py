"""RL loop pieces that need no model: batch metrics, GRPO group assembly, the loop with a fake learner."""
import time
import types

import numpy as np
import pytest

from sao import rl_loop, timing
from sao.types import Trajectory


def traj(prompt_id, reward=1.0, versions=(3, 3, 4), tools=0, epoch=0, group=0):
    n = len(versions)
    return Trajectory(tokens=np.arange(n + 2), action_mask=[False, False] + [True] * n,
                      rollout_logprobs=[0.0, 0.0] + [-0.5] * n, policy_version=[0, 0, *versions],
                      reward=reward, finish="stop", prompt_id=prompt_id, trajectory_id=prompt_id,
                      metadata={"num_tool_calls": tools}, epoch=epoch, group=group)


class FakeSource:
    def __init__(self, batches):
        self.batches, self.pushed = list(batches), []

    def get_batch(self, timeout=None):
        return self.batches.pop(0) if self.batches else []

    def push_weights(self, version, uri, timeout=None):
        self.pushed.append((version, uri))
        return {}

    def snapshot(self):
        return {"dropped": 2, "trained": 0, "drops": {"stale": 2}}


def test_batch_metrics():
    trajs = [traj("a", 1.0, (4, 4), tools=1), traj("b", 0.0, (2, 3, 4))]
    m = rl_loop.batch_metrics(trajs, learner_version=4)
    assert m["rollout/reward"] == 0.5 and m["rollout/tool_use"] == 0.5
    assert m["rollout/tool_timeouts"] == 0.0
    trajs[0].metadata["tool_timeouts"] = 3                  # env info, carried in metadata
    assert rl_loop.batch_metrics(trajs, learner_version=4)["rollout/tool_timeouts"] == 1.5
    assert m["batch/staleness_counts"] == [3, 1, 1]          # lags 0,0,0 | 2,1,0 ... per action token


def test_group_batcher_serves_whole_groups():
    # Groups of 2, batch of 4 = 2 groups; members arrive interleaved and across batches.
    src = FakeSource([[traj("p1", group=0), traj("p2", group=0), traj("p3", group=1), traj("p1", group=1)],
                      [traj("p2", group=1), traj("p3", group=0), traj("p4", group=0), traj("p5", group=0)]])
    g = rl_loop.GroupBatcher(src.get_batch, group_size=2, batch_size=4)
    first = g()
    assert [(t.prompt_id, t.epoch) for t in first] == [("p1", 0), ("p1", 0), ("p2", 0), ("p2", 0)]
    assert sorted(t.group for t in first[:2]) == [0, 1]
    # p3 completes in the second source batch but p4, p5 never do: no partial batch is served.
    assert g() == []
    assert list(g._ready) and [t.prompt_id for t in g._ready[0]] == ["p3", "p3"]
    with pytest.raises(ValueError):
        rl_loop.GroupBatcher(src.get_batch, group_size=3, batch_size=4)


def test_group_batcher_keeps_epochs_apart():
    # The same prompt in two epochs is two groups, even when their members interleave.
    src = FakeSource([[traj("p", epoch=0, group=0), traj("p", epoch=1, group=0),
                       traj("p", epoch=1, group=1), traj("p", epoch=0, group=1)]])
    g = rl_loop.GroupBatcher(src.get_batch, group_size=2, batch_size=2)
    assert [(t.epoch, t.group) for t in g()] == [(1, 0), (1, 1)]
    assert [(t.epoch, t.group) for t in g()] == [(0, 0), (0, 1)]


class FakeLearner:
    """Counts updates; every update is one actor update (policy version + 1)."""

    cfg = types.SimpleNamespace(length_buckets=(8,), batch_size=4, pad_id=0)

    def __init__(self):
        self.advantages = []

    def update(self, states, batch, seq_advantages=None):
        self.advantages.append(seq_advantages)
        return types.SimpleNamespace(policy_version=states.policy_version + 1), {"actor/loss": 0.0}


def test_loop_pulls_batches_from_the_hook_and_pushes_to_the_source():
    src = FakeSource([[traj("p1", group=0), traj("p1", group=1)],
                      [traj("p2", group=0), traj("p2", group=1)], []])
    learner, records = FakeLearner(), []
    hooks = rl_loop.LoopHooks(
        publish=lambda states, version: f"uri{version}",
        write=lambda step, m: records.append((step, m)),
        next_batch=rl_loop.GroupBatcher(src.get_batch, group_size=2, batch_size=2),
        advantages=lambda trajs, b: np.full((b,), 0.5, np.float32),
        batch_metrics=lambda trajs: {"env/n": float(len(trajs))})
    states, done, counts = rl_loop.train(learner, types.SimpleNamespace(policy_version=0), src,
                                         loop=rl_loop.LoopConfig(steps=5), start_step=0, hooks=hooks)
    assert (states.policy_version, done, counts) == (2, 2, {"trajectories": 4, "dropped": 2})
    assert src.pushed == [(1, "uri1"), (2, "uri2")]          # weights reach the fleet
    assert [s for s, _ in records] == [1, 2] and records[0][1]["env/n"] == 2.0
    assert records[0][1]["fleet/drops/stale"] == 2.0
    np.testing.assert_array_equal(learner.advantages[0], [0.5, 0.5, 0.5, 0.5])


class SlowSource(FakeSource):
    def get_batch(self, timeout=None):
        time.sleep(0.02)
        return super().get_batch(timeout)


class SlowLearner(FakeLearner):
    def update(self, states, batch, seq_advantages=None):
        time.sleep(0.03)
        return super().update(states, batch, seq_advantages)


def test_loop_times_its_parts():
    # Each part's time lands in its own bucket: the source's wait, the learner's update, publish, eval.
    src = SlowSource([[traj("p1"), traj("p2")], [traj("p3"), traj("p4")]])
    records, timer = [], timing.Stopwatch()

    def publish(states, version):
        time.sleep(0.01)
        return f"uri{version}"

    def evaluate(states, step):
        time.sleep(0.04)
        return {"eval/accuracy": 1.0}

    hooks = rl_loop.LoopHooks(publish=publish, evaluate=evaluate,
                              write=lambda step, m: records.append(m))
    rl_loop.train(SlowLearner(), types.SimpleNamespace(policy_version=0), src,
                  loop=rl_loop.LoopConfig(steps=3, eval_every=1), start_step=0, hooks=hooks, timer=timer)
    assert set(timer.totals) <= set(timing.RL_PARTS)
    assert timer.get("wait_fleet") >= 3 * 0.02              # two batches, then the empty third
    assert timer.get("update") >= 2 * 0.03 and timer.get("publish") >= 2 * 0.01
    assert timer.get("eval") >= 2 * 0.04 and timer.get("checkpoint") == 0.0
    for m in records:
        assert m["time/update_s"] >= 0.03 and m["time/wait_fleet_s"] >= 0.02
        assert 0.0 <= m["time/update_cpu_s"] < m["time/update_s"]   # the fake learner sleeps
        parts = sum(m[f"time/{p}_s"] for p in timing.RL_PARTS if f"time/{p}_s" in m)
        assert m["time/step_s"] == pytest.approx(parts)


def test_a_step_is_recorded_before_its_checkpoint():
    """Killed while (or right after) saving step s, a run has s's record: it goes out first,
    and the checkpoint's timing follows in a second record of the same step."""
    src = FakeSource([[traj("p1"), traj("p2")], [traj("p3"), traj("p4")], []])
    records = []

    def checkpoint(states, step):
        assert records and records[-1][0] == step and "actor/loss" in records[-1][1]
        time.sleep(0.02)

    hooks = rl_loop.LoopHooks(publish=lambda s, v: f"uri{v}", checkpoint=checkpoint,
                              write=lambda step, m: records.append((step, m)))
    rl_loop.train(FakeLearner(), types.SimpleNamespace(policy_version=0), src,
                  loop=rl_loop.LoopConfig(steps=3, checkpoint_every=2), start_step=0, hooks=hooks)
    assert [s for s, _ in records] == [1, 2, 2]            # step 2: the record, then its timing
    assert "time/checkpoint_s" not in records[1][1] and "actor/loss" in records[1][1]
    assert set(records[2][1]) <= {k for k in records[2][1] if k.startswith("time/")}
    assert records[2][1]["time/checkpoint_s"] >= 0.02
    assert records[2][1]["time/step_s"] >= records[1][1]["time/step_s"] + 0.02


def test_eval_offset_evaluates_at_equal_actor_updates():
    # A critic warm-up of 2 steps: evaluations after learner steps 12 and 22 (10 and 20 actor
    # updates), none at 10 / 20, and none at the last step (the run's final evaluation).
    src = FakeSource([[traj(f"p{i}")] * 4 for i in range(30)])
    learner, evals = FakeLearner(), []
    hooks = rl_loop.LoopHooks(publish=lambda s, v: "uri", evaluate=lambda s, step: evals.append(step)
                              or {})
    rl_loop.train(learner, types.SimpleNamespace(policy_version=0), src,
                  loop=rl_loop.LoopConfig(steps=32, eval_every=10, eval_offset=2), start_step=0,
                  hooks=hooks)
    assert evals == [12, 22]
