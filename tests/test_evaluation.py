"""Held-out metrics of sampled episodes (sao.evaluation)."""
import pytest

from sao import evaluation
from test_rl_loop import traj


def test_pass_at_1():
    trajs = [traj("a", 1.0, (4, 4), tools=1), traj("b", 0.0, (2, 3, 4))]
    e = evaluation.pass_at_1(trajs)
    assert e["eval/accuracy"] == 0.5 and e["eval/tool_use"] == 0.5 and e["eval/prompts"] == 2
    assert e["eval/tool_timeouts"] == 0.0
    trajs[1].metadata["tool_timeouts"] = 1
    assert evaluation.pass_at_1(trajs)["eval/tool_timeouts"] == 0.5
    with pytest.raises(ValueError):
        evaluation.pass_at_1([])


def test_pass_at_1_over_several_samples_per_prompt_keeps_each_prompts_count():
    # 2 prompts x 4 samples (what eval.samples_per_prompt=4 sends): the mean over all 8, and
    # the solved count of each prompt, which a paired comparison of two arms needs.
    trajs = [traj(p, r) for p, r in [("a", 1.0), ("b", 0.0), ("a", 1.0), ("b", 1.0),
                                     ("a", 0.0), ("b", 0.0), ("a", 1.0), ("b", 0.0)]]
    e = evaluation.pass_at_1(trajs)
    assert e["eval/accuracy"] == 0.5 and e["eval/solved_per_prompt"] == [3, 1]
