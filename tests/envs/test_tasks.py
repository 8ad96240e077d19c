"""Tasks and the tool environment: reasoning-gym, math-verify, HumanEval, episodes."""
import asyncio
import json

import pytest

from sao.envs import base, sandbox
from sao.envs.humaneval import HumanEvalTask, build_program, load_problems
from sao.envs import math_grader
from sao.envs.math_grader import math_verify_score
from sao.envs.reasoning import MathTask, ReasoningGymTask
from sao.envs.tool_env import EpisodeConfig, ToolEnv

needs_sandbox = pytest.mark.skipif(not sandbox.sandbox_available(),
                                   reason="sandbox unavailable here")


@pytest.fixture(scope="module", autouse=True)
def stop_grading_pool():
    yield
    math_grader.shutdown()                  # the spawned math-verify workers


@pytest.fixture(scope="module")
def arithmetic():
    return ReasoningGymTask("basic_arithmetic", size=8, seed=3)


def test_reasoning_gym_records_are_deterministic_and_json(arithmetic):
    recs = arithmetic.records()
    assert len(recs) == 8 and len({r["prompt_id"] for r in recs}) == 8
    assert recs == ReasoningGymTask("basic_arithmetic", size=8, seed=3).records()
    assert recs != ReasoningGymTask("basic_arithmetic", size=8, seed=4).records()
    assert json.loads(json.dumps(recs)) == recs
    assert all(r["task"] == "rg/basic_arithmetic" for r in recs)


@pytest.mark.parametrize("name", ["chain_sum", "gsm_symbolic", "countdown"])
def test_reasoning_gym_grading_uses_dataset_scorer(name):
    task = ReasoningGymTask(name, size=2, seed=0)
    rec = task.records()[0]
    entry = json.loads(json.dumps(rec["entry"]))             # as it comes off the wire
    assert task.grade(str(entry["answer"]), entry) == 1.0
    assert task.grade("definitely wrong", entry) < 0.5


def test_bad_task_config_raises():
    with pytest.raises(ValueError):
        ReasoningGymTask("no_such_dataset", size=2).records()
    with pytest.raises(ValueError):
        ReasoningGymTask("chain_sum", size=0)
    with pytest.raises(ValueError):
        MathTask("m", [{"question": "1+1"}])
    with pytest.raises(ValueError):
        base.make_prompt("p", "t", "q", {"bad": object()})


def test_math_verify_from_worker_threads():
    async def grade_all():
        cases = [("\\boxed{\\frac{1}{2}}", "0.5"), ("0.5", "1/2"), ("3", "1/2"), ("", "1")]
        return await asyncio.gather(*(asyncio.to_thread(math_verify_score, a, g)
                                      for a, g in cases))
    assert asyncio.run(grade_all()) == [1.0, 1.0, 0.0, 0.0]
    task = MathTask("frac", [{"question": "Half of one?", "answer": "1/2"}])
    assert task.grade("$\\frac{2}{4}$", task.records()[0]["entry"]) == 1.0


@needs_sandbox
def test_humaneval_canonical_passes_and_wrong_fails():
    problems = {p["task_id"]: p for p in load_problems()}
    assert len(problems) == 164
    task = HumanEvalTask(["HumanEval/0", "HumanEval/2"])
    for rec in task.records():
        solution = problems[rec["prompt_id"]]["canonical_solution"]
        assert "canonical_solution" not in rec["entry"]
        assert task.grade(solution, rec["entry"]) == 1.0                    # body completion
        full = "```python\n" + rec["entry"]["prompt"] + solution + "```"
        assert task.grade(full, rec["entry"]) == 1.0                        # whole function
        assert task.grade("    return None\n", rec["entry"]) == 0.0
    quick = HumanEvalTask(["HumanEval/0"], limits=sandbox.SandboxLimits(timeout_s=1.5))
    assert quick.grade("    while True:\n        pass\n", quick.records()[0]["entry"]) == 0.0
    with pytest.raises(ValueError):
        HumanEvalTask(["HumanEval/9999"])


def test_humaneval_program_layout():
    entry = {"prompt": "def f(x):\n", "test": "def check(c):\n    assert c(1) == 2\n",
             "entry_point": "f"}
    assert build_program("    return x + 1\n", entry).startswith("def f(x):\n    return x + 1")
    assert build_program("def f(x):\n    return 2\n", entry).startswith("def f(x):\n    return 2")
    assert build_program("x", entry).endswith("check(f)\n")
    assert build_program("return x + 1", entry).startswith("def f(x):\n    return x + 1")


@needs_sandbox
def test_humaneval_episode_with_tool_env():
    problems = {p["task_id"]: p for p in load_problems()}
    task = HumanEvalTask(["HumanEval/4"])
    rec = task.records()[0]
    env = ToolEnv(task, EpisodeConfig(max_turns=3))
    assert "def mean_absolute_deviation" in env.reset(rec)
    step = env.step("<python>print(sum([1.0, 2.0]) / 2)</python>")
    assert step.observation_text == "1.5"
    body = problems["HumanEval/4"]["canonical_solution"]
    final = env.step(f"<answer>\n{body}</answer>")
    assert final.done and final.reward == 1.0 and final.info["tool_calls"] == 1


@needs_sandbox
def test_tool_episode_tags(arithmetic):
    rec = arithmetic.records()[0]
    expr = rec["entry"]["metadata"]["expression"]
    env = ToolEnv(arithmetic, EpisodeConfig(max_turns=4, tool_timeout_s=5))
    prompt = env.reset(rec)
    assert rec["text"] in prompt and "<python>" in prompt
    first = env.step(f"Let me compute. <python>print({expr})</python>")
    assert not first.done and first.info["tool_calls"] == 1
    value = first.observation_text.strip()
    assert float(value) == float(eval(expr))           # the tool really ran the program
    last = env.step(f"<answer>{rec['entry']['answer']}</answer>")
    assert last.done and last.reward == 1.0 and last.observation_text is None
    assert last.info["correct"] == 1.0 and last.info["end"] == "answer" and last.info["turns"] == 2
    env.reset(rec)
    assert env.step("<answer>nonsense</answer>").reward == 0.0


@needs_sandbox
def test_tool_episode_hermes_and_limits(arithmetic):
    rec = arithmetic.records()[1]
    env = ToolEnv(arithmetic, EpisodeConfig(tool_format="hermes", max_turns=3, max_tool_calls=1))
    prompt = env.reset(rec)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    call = json.dumps({"name": "python", "arguments": {"code": "1/0"}})
    step = asyncio.run(env.astep(f"<tool_call>\n{call}\n</tool_call><|im_end|>"))
    assert not step.done and "ZeroDivisionError" in step.observation_text
    assert step.info["tool_errors"] == 1
    over = env.step(f"<tool_call>{call}</tool_call>")
    assert over.done and over.reward == 0.0 and over.info["end"] == "max_tool_calls"
    env.reset(rec)
    assert env.step("<think>no idea</think><|im_end|>").info["end"] == "no_answer"


def test_env_errors(arithmetic):
    env = ToolEnv(arithmetic)
    with pytest.raises(RuntimeError):
        env.step("<answer>1</answer>")
    with pytest.raises(ValueError):
        env.reset({"text": "no id"})
    with pytest.raises(ValueError):
        env.reset(base.make_prompt("x/1", "other_task", "q", {}))
    with pytest.raises(ValueError):
        EpisodeConfig(tool_format="json")
