"""SweEnv and grading on validated micro tasks: the oracle scores 1, doing
nothing 0, deleting or editing the failing tests (or steering pytest through
config) 0; tool framing and metadata."""
from __future__ import annotations

import json

import pytest

from sao.envs import EpisodeConfig, env_factory, make_task
from sao.envs.swe import SweEnv, SweTask, grade_patch
from sao.envs.swe.demos import demonstration, fix_commands
from sao.envs.swe.files import unified_diff
from sao.envs.swe.repos import start_files


def _env(entries, fmt="hermes", **kw):
    task = SweTask("swe/micro", entries)
    cfg = EpisodeConfig(tool_format=fmt, max_turns=kw.pop("max_turns", 6),
                        max_tool_calls=kw.pop("max_tool_calls", 5), tool_timeout_s=20.0,
                        max_observation_chars=1500)
    return task, SweEnv(task, cfg)


def _call(name, **args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call><|im_end|>'


def test_oracle_patch_scores_one_and_noop_zero(micro_entries):
    for entry in micro_entries:
        assert grade_patch(entry, entry["patch"])["correct"] == 1.0
    facts = grade_patch(micro_entries[0], "")
    assert facts["correct"] == 0.0 and facts["f2p_passed"] == 0
    assert facts["tests_passed"] == len(micro_entries[0]["PASS_TO_PASS"])
    bad = grade_patch(micro_entries[0], "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    assert bad["correct"] == 0.0 and "does not apply" in bad["error"]


def test_editor_fix_through_the_env_scores_one(micro_entries):
    entry = micro_entries[0]
    task, env = _env([entry])
    prompt = env.reset(task.records()[0])
    assert prompt.startswith("<|im_start|>system\n") and '"name": "str_replace_editor"' in prompt
    assert entry["problem_statement"] in prompt and prompt.endswith("<|im_start|>assistant\n")
    bug = entry["bug"]
    res = env.step(_call("str_replace_editor", command="view", path=bug["path"]))
    assert not res.done and bug["new"][0].strip() in res.observation_text
    res = env.step(_call("str_replace_editor", command="str_replace", path=bug["path"],
                         old_str=bug["new"][0], new_str=bug["old"][0]))
    assert not res.done and "edited" in res.observation_text
    res = env.step(_call("submit"))
    assert res.done and res.reward == 1.0
    info = res.info
    assert info["end"] == "submit" and info["correct"] == 1.0 and info["turns"] == 3
    assert info["tool_calls"] == 2 and info["tool_errors"] == 0
    assert info["tests_passed"] == info["tests_total"] == (
        len(entry["FAIL_TO_PASS"]) + len(entry["PASS_TO_PASS"]))
    assert info["patch_lines"] == 2 and info["patch_bytes"] > 0


def test_bash_fix_in_the_byte_tag_format_scores_one(micro_entries):
    demo = demonstration(micro_entries[1], fmt="tags")
    actions = [text for text, is_action in demo.spans if is_action]
    assert actions[-1] == "<answer>done</answer>"
    assert actions[:2] == [f"<python>{c}</python>" for c in fix_commands(micro_entries[1])]
    assert demo.spans[1][0].startswith("<output>") and demo.spans[1][0].endswith("</output>")


@pytest.mark.parametrize("cheat", [
    "rm -f test_calc.py",
    "printf 'def test_ok():\\n    pass\\n' > test_calc.py",
    "printf 'import pytest\\ndef pytest_collection_modifyitems(items):\\n"
    "    items[:] = []\\n' > conftest.py",
    "printf '[pytest]\\naddopts = -k nothing\\n' > pytest.ini",
])
def test_deleting_or_editing_tests_earns_nothing(micro_entries, cheat):
    entry = micro_entries[0]
    task, env = _env([entry], fmt="tags")
    env.reset(task.records()[0])
    # The cheat works inside the episode: the suite no longer fails there.
    env.step(f"<python>{cheat}</python>")
    res = env.step("<python>python -m pytest -q -p no:cacheprovider 2>&1 | tail -1</python>")
    assert "failed" not in res.observation_text
    res = env.step("<answer>done</answer>")
    assert res.done and res.reward == 0.0 and res.info["f2p_passed"] == 0


def test_cheating_patch_earns_nothing(micro_entries):
    entry = micro_entries[0]
    start = start_files(entry)
    no_tests = {p: d for p, d in start.items() if not p.startswith("test_")}
    assert grade_patch(entry, unified_diff(start, no_tests))["correct"] == 0.0


def test_limits_errors_and_max_turns(micro_entries):
    task, env = _env(micro_entries[:1], max_turns=3)
    env.reset(task.records()[0])
    res = env.step("<tool_call>{not json</tool_call>")
    assert not res.done and res.observation_text.startswith("[tool error]")
    res = env.step(_call("str_replace_editor", command="view", path="../../etc/passwd"))
    assert not res.done and "inside the repository" in res.observation_text
    res = env.step(_call("bash", command="echo hi"))
    assert res.done and res.info["end"] == "max_turns" and res.reward == 0.0
    assert res.info["tool_errors"] == 2 and res.info["tool_calls"] == 3
    with pytest.raises(RuntimeError):
        SweEnv(task).step("x")


def test_factory_builds_swe_env(micro_entries):
    task = SweTask("swe/micro", micro_entries)
    make_env = env_factory({"swe/micro": task}, EpisodeConfig(tool_format="tags"))
    assert isinstance(make_env(), SweEnv)
    other = make_task("math", name="m", items=[{"question": "1+1", "answer": "2"}])
    with pytest.raises(ValueError, match="cannot be mixed"):
        env_factory({"swe/micro": task, "m": other}, EpisodeConfig())
    with pytest.raises(ValueError, match="split must be"):
        make_task("swe/micro", split="nope")
    with pytest.raises(ValueError, match="unknown task spec"):
        make_task("swe/nothing")


def test_native_loop_harness_and_demonstrations_see_the_same_prompt(micro_entries):
    # sao_swe.py:cpu inherits the tiny models' question-only prompts from common.cpu;
    # an SWE issue needs its tool instructions, and the native loop (learner-side
    # evaluation, notebooks), the reference harness on the workers and the scripted
    # demonstrations must all show the same first prompt (ids included).
    from experiments import sao_swe
    from sao import components, config_checks
    from sao.fleet.endpoint.dialect import dialect_for
    from sao.fleet.endpoint.messages import Message
    from sao.fleet.endpoint.wiring import reference_harness
    from sao.models.tokenizer import ByteTokenizer

    cfg = sao_swe.get_config("cpu")
    tasks = {"swe/micro": SweTask("swe/micro", micro_entries)}
    record = tasks["swe/micro"].records()[0]
    make_env = components.make_env_factory(cfg, tasks)
    native = make_env().reset(record)
    [first] = reference_harness(cfg, tasks, make_env).messages_for(record)
    served = dialect_for(ByteTokenizer()).prompt_text([Message(**first)], [])
    assert native == served == demonstration(micro_entries[0], fmt="tags").prompt
    assert "<python>command</python>" in native and config_checks.problems(cfg) == []
    with cfg.unlocked():
        cfg.env.prompt_style = "question"
    assert any("prompt_style='question'" in p for p in config_checks.problems(cfg))
