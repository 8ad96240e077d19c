"""Driver pieces that need no model: batch metrics, pass@1, GRPO group assembly."""
import numpy as np
import pytest

from sao import driver
from sao.types import Trajectory


def traj(prompt_id, reward=1.0, versions=(3, 3, 4), tools=0):
    n = len(versions)
    return Trajectory(tokens=np.arange(n + 2), action_mask=[False, False] + [True] * n,
                      rollout_logprobs=[0.0, 0.0] + [-0.5] * n, policy_version=[0, 0, *versions],
                      reward=reward, finish="stop", prompt_id=prompt_id, trajectory_id=prompt_id,
                      metadata={"num_tool_calls": tools})


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


def test_batch_metrics_and_pass_at_1():
    trajs = [traj("a", 1.0, (4, 4), tools=1), traj("b", 0.0, (2, 3, 4))]
    m = driver.batch_metrics(trajs, learner_version=4)
    assert m["rollout/reward"] == 0.5 and m["rollout/tool_use"] == 0.5
    assert m["batch/staleness_counts"] == [3, 1, 1]          # lags 0,0,0 | 2,1,0 ... per action token
    e = driver.pass_at_1(trajs)
    assert e["eval/accuracy"] == 0.5 and e["eval/tool_use"] == 0.5 and e["eval/prompts"] == 2
    with pytest.raises(ValueError):
        driver.pass_at_1([])


def test_grouped_source_serves_whole_groups():
    # Groups of 2, batch of 4 = 2 groups; members arrive interleaved and across batches.
    src = FakeSource([[traj("p1#e0#g0"), traj("p2#e0#g0"), traj("p3#e0#g1"), traj("p1#e0#g1")],
                      [traj("p2#e0#g1"), traj("p3#e0#g0"), traj("p4#e0#g0"), traj("p5#e0#g0")]])
    g = driver.GroupedSource(src, group_size=2, batch_size=4)
    first = g.get_batch()
    assert [t.prompt_id for t in first] == ["p1#e0", "p1#e0", "p2#e0", "p2#e0"]
    # p3 completes in the second source batch but p4, p5 never do: no partial batch is served.
    assert g.get_batch() == []
    assert list(g._ready) and [t.prompt_id for t in g._ready[0]] == ["p3#e0", "p3#e0"]
    g.push_weights(1, "uri")
    assert src.pushed == [(1, "uri")]
    with pytest.raises(ValueError):
        driver.GroupedSource(src, group_size=3, batch_size=4)
