"""Task specs and env factories (what run wiring calls)."""
import pytest

from sao.envs import EpisodeConfig, ToolEnv, env_factory, iter_records, make_task
from sao.envs.base import Task, make_prompt
from sao.envs.drift import DriftEnv, DriftSchedule, LearnerClock
from sao.envs.judges import OpenAIJudge, judge_from_spec


class DriftSum(Task):
    name = "drift/sum"

    def records(self):
        return [make_prompt("drift/sum/0", self.name, "What is 2 + 2?", {"answer": "4"})]

    def grade(self, answer, entry):
        return float(answer.strip() == entry["answer"])


def test_make_task_specs():
    rg = make_task("rg/chain_sum", size=3, seed=1)
    drift = make_task("drift/chain_sum", size=3, seed=1)
    assert rg.name == "rg/chain_sum" and drift.name == "drift/chain_sum"
    assert [r["text"] for r in rg.records()] == [r["text"] for r in drift.records()]
    assert all(r["task"] == "drift/chain_sum" for r in drift.records())
    assert len(iter_records([rg, drift])) == 6
    with pytest.raises(ValueError, match="duplicate"):
        iter_records([rg, rg])
    with pytest.raises(ValueError, match="unknown task spec"):
        make_task("gsm8k")


def test_cycling_schedule_and_judge_spec():
    assert DriftSchedule.cycling((150, 300)).styles == ("bare", "sentence", "boxed")
    assert DriftSchedule.cycling((1, 2, 3, 4)).styles == ("bare", "sentence", "boxed", "bare",
                                                         "sentence")
    assert judge_from_spec("rule") is None
    assert isinstance(judge_from_spec("http://127.0.0.1:1/v1", model="m"), OpenAIJudge)
    with pytest.raises(ValueError):
        judge_from_spec("gpt-4")


def test_env_factory_plain_and_drift():
    episode = EpisodeConfig(max_turns=2)
    chain = make_task("rg/chain_sum", size=2)
    plain = env_factory({chain.name: chain}, episode)()
    assert type(plain) is ToolEnv

    clock = LearnerClock()
    make = env_factory({"drift/sum": DriftSum()}, episode, drift_schedule=(5,), clock=clock)
    env = make()
    assert isinstance(env, DriftEnv) and env is not make()
    rec = DriftSum().records()[0]
    env.reset(rec)
    assert env.step("<answer>4</answer>").reward == 1.0
    clock.set(5)                                  # style switched to "sentence"
    env.reset(rec)
    assert env.step("<answer>4</answer>").reward == 0.0
    env.reset(rec)
    assert env.step("<answer>The answer is 4.</answer>").reward == 1.0

    with pytest.raises(ValueError, match="clock"):
        env_factory({"drift/sum": DriftSum()}, episode, drift_schedule=(5,))
    with pytest.raises(ValueError, match="drift_schedule"):
        env_factory({"drift/sum": DriftSum()}, episode)
    with pytest.raises(ValueError, match="every task"):
        env_factory({"drift/sum": DriftSum(), chain.name: chain}, episode,
                    drift_schedule=(5,), clock=clock)
