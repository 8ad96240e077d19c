"""The SWE experiments' values: harness, tasks, coding DIS band, evaluation on the fleet."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from experiments import grpo_dis_swe, sao_swe  # noqa: E402
from sao import components, config_checks  # noqa: E402

HARNESS = {"cpu": "reference", "cpu_long": "reference", "smollm2_cpu": "mini-swe-agent",
           "qwen3_30b_a3b": "mini-swe-agent"}


@pytest.mark.parametrize("module", [sao_swe, grpo_dis_swe])
@pytest.mark.parametrize("variant", sorted(HARNESS))
def test_swe_variants(module, variant):
    c = module.get_config(variant)
    assert c.env.harness == HARNESS[variant] and c.eval.where == "fleet"
    assert tuple(c.env.tasks) == (("swe/source",) if variant.startswith("qwen3") else ("swe/micro",))
    assert (c.learner.eps_low, c.learner.eps_high) == (0.8, 3.0)      # ratio in (0.2, 4.0)
    if variant in ("cpu", "cpu_long"):
        assert c.sft.task == "swe/micro" and c.sft.steps > 0 and c.env.tool_format == "tags"
    else:
        assert c.env.tool_format == "hermes"
    if variant.startswith("qwen3"):
        assert (c.rollout.max_turns, c.rollout.max_len) == (300, 32768)
    if module is grpo_dis_swe:
        assert c.learner.advantage_estimator == "grpo" and c.rollout.group_size >= 2
        assert c.critic.critic_steps == 0 and c.critic.value_pretrain_steps == 0


def test_a_harness_must_evaluate_on_the_fleet():
    c = sao_swe.get_config("cpu")
    c.eval.where = "learner"
    assert any("eval.where='fleet'" in p for p in config_checks.problems(c))


@pytest.mark.parametrize("module", [sao_swe, grpo_dis_swe])
@pytest.mark.parametrize("variant", ["cpu", "cpu_long", "smollm2_cpu"])
def test_cpu_variants_hold_out_enough_tasks_to_evaluate(module, variant):
    # The seeded split holds out 4 of the 24 micro tasks; the cpu variant asked for 6
    # and its default command stopped before the first step.
    cfg = module.get_config(variant)
    train_records, heldout = components.split_prompts(cfg, components.make_tasks(cfg))
    assert len(heldout) == cfg.eval.num_prompts and len(train_records) >= cfg.learner.batch_size


def test_no_issue_variant_shows_a_held_out_issue():
    # cpu_long's warm start showed 15 of its 320 demonstrations under an exact held-out
    # issue text (the same failing test and hint as a held-out bug), beside the fix of a
    # training bug on the same line: every held-out task it "solved" had been shown so.
    # Variants of the SFT demonstrations and of the RL prompts now skip those texts.
    from sao.data.swe_demos import issue_variant_records, swe_sft_demos
    cfg = sao_swe.get_config("cpu_long")
    train_records, held_all = components.split_prompts(cfg, components.make_tasks(cfg),
                                                       evaluated_only=False)
    held = {r["text"] for r in held_all}
    demos = swe_sft_demos(train_records, task="swe/micro", fmt="tags", limit=10_000,
                          issue_variants_per_task=8, seed=cfg.sft.seed, exclude_texts=held,
                          log=lambda _: None)
    rl = issue_variant_records(train_records, 8, seed=0, exclude_texts=held)
    assert len(demos) > 5 * len(train_records) and len(rl) > 5 * len(train_records)
    assert not [d for d in demos if any(t in d.prompt for t in held)]
    assert not [r for r in rl if r["text"] in held]
    # Without the exclusion the same draw does show held-out issues (the test can fail).
    unguarded = issue_variant_records(train_records, 8, seed=0)
    assert [r for r in unguarded if r["text"] in held]
