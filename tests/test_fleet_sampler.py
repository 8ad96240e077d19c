"""Held-out sampling on the rollout fleet (sao.evaluation.FleetSampler).

The learner holds no engine: the states are published, pushed, and each
prompt is one sampling-job lease at the requested temperature. Before and
after RL a short-lived dispatcher does it; during RL the run's own
dispatcher (``using``), which pushes only a version it has not pushed.
"""
import dataclasses

import pytest

from sao.evaluation import FleetSampler
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
# tests/ is on sys.path (pytest puts the rootdir conftest's directory there); the name
# "tests" is not ours to import: a package may install its own top-level one.
from fleet.helpers import VOCAB, prompts
from fleet.test_sample_jobs import temperature_worker


@dataclasses.dataclass
class States:
    policy_version: int


class Publisher:
    def __init__(self):
        self.calls = []

    def __call__(self, states, version):
        self.calls.append(version)
        return f"uri-{version}"


def held_out(n):
    return [{"prompt_id": f"e{i}", "length": 5, "reward": float(i < 2)} for i in range(n)]


def test_fleet_sampler_short_lived_and_during_rl():
    publish = Publisher()
    cfg = DispatcherConfig(batch_size=2, vocab_size=VOCAB, tau=0, reconnect_s=0.05)
    with temperature_worker() as a, temperature_worker() as b:  # they serve version 0
        sampler = FleetSampler([a.address, b.address], cfg, publish, temperature=1.0,
                               timeout_s=30)
        before = sampler.sample(States(1), held_out(6))
        m = sampler.pass_at_1(States(1), held_out(4), temperature=0.5)
        assert [t.prompt_id for t in before] == [f"e{i}" for i in range(6)]
        assert all(t.metadata["temperature"] == 1.0 and set(t.policy_version) == {1}
                   for t in before)
        assert m["eval/accuracy"] == 0.5 and m["eval/prompts"] == 4 and m["eval/missing"] == 0
        assert a.engine.weight_uris == b.engine.weight_uris == ["uri-1"]  # loaded once
        rl = Dispatcher([a.address, b.address], prompts(20, length=4),
                        dataclasses.replace(cfg, initial_version=1))
        rl.push_weights(2, publish(States(2), 2))
        with rl, sampler.using(rl):
            rl.get_batch(timeout=30)
            during = sampler.sample(States(2), held_out(3), temperature=0.25)  # pushed already
            rl.push_weights(3, publish(States(3), 3))
            rl.get_batch(timeout=30)
            later = sampler.sample(States(4), held_out(3))  # not pushed yet: the sampler does
            trained = rl.snapshot()["trained"]
            sampled = rl.snapshot()["sampled"]
        assert all(t.metadata["temperature"] == 0.25 and set(t.policy_version) == {2}
                   for t in during)
        assert all(set(t.policy_version) == {4} for t in later)
        assert publish.calls == [1, 1, 2, 3, 4] and rl.learner_version == 4
        assert trained == 4 and sampled == 6
        after = sampler.sample(States(4), held_out(2))  # short-lived again: nothing to load
        assert a.engine.weight_uris == ["uri-1", "uri-2", "uri-3", "uri-4"]
        assert [set(t.policy_version) for t in after] == [{4}, {4}]


def test_fleet_sampler_counts_missing_prompts_as_unsolved():
    publish = Publisher()
    cfg = DispatcherConfig(batch_size=2, vocab_size=VOCAB, max_attempts=2, reconnect_s=0.05,
                           max_length=16)
    with temperature_worker() as a:
        sampler = FleetSampler([a.address], cfg, publish, temperature=1.0, timeout_s=30)
        prompts_ = held_out(4)
        prompts_[0]["length"] = 40  # too long: dropped by validation, no trajectory
        m = sampler.pass_at_1(States(1), prompts_, temperature=1.0)
    assert m["eval/missing"] == 1 and m["eval/prompts"] == 4
    assert m["eval/accuracy"] == pytest.approx(1 / 4)  # e1 solved; e0 missing counts as unsolved
