"""The agent loop builds exactly engine tokens + framed observations (token-in/token-out)."""
import asyncio
import dataclasses

import numpy as np
import pytest

from sao.models.tokenizer import ByteTokenizer
from sao.rollout import SamplingParams, ScriptedEngine, ScriptedTurn, run_episode, run_episodes
from sao.types import validate

TOK = ByteTokenizer()
PY, PY_END, OUT, OUT_END = 259, 260, 261, 262
ANS, ANS_END, EOS = 263, 264, 258


@dataclasses.dataclass
class StepResult:
    observation_text: str
    done: bool
    reward: float
    info: dict


class CalcEnv:
    """Minimal tool env: evaluates `<python>a+b</python>`, grades `<answer>`."""

    def __init__(self, fail=False):
        self.fail = fail
        self.actions = []

    def reset(self, prompt):
        return TOK.encode(prompt["question"])

    def step(self, action_text):
        self.actions.append(action_text)
        if self.fail:
            raise RuntimeError("sandbox died")
        if action_text.startswith("<python>"):
            code = action_text.removeprefix("<python>").removesuffix("</python>")
            return StepResult(str(eval(code, {})), False, 0.0, {})
        answer = action_text.removesuffix("<eos>")
        answer = answer.removeprefix("<answer>").removesuffix("</answer>")
        return StepResult("", True, float(answer == "5"), {"answer": answer})


def enc(s):
    return TOK.encode(s)


def test_multi_turn_trajectory_exact():
    act1 = enc("<python>2+3</python>")
    act2 = enc("<answer>5</answer>")
    eng = ScriptedEngine([act1, ScriptedTurn(act2, swap_to={2: 1})])
    env = CalcEnv()
    traj = asyncio.run(run_episode(eng, env, TOK, {"id": "p0", "question": "2+3="},
                                   SamplingParams(max_new_tokens=64),
                                   max_turns=4, max_total_tokens=256))
    prompt, obs = enc("2+3="), [OUT, *enc("5"), OUT_END]
    assert traj.tokens.tolist() == prompt + act1 + obs + act2
    assert act1[0] == PY and act1[-1] == PY_END and act2[0] == ANS and act2[-1] == ANS_END
    mask = [0] * len(prompt) + [1] * len(act1) + [0] * len(obs) + [1] * len(act2)
    assert traj.action_mask.astype(int).tolist() == mask
    lp1 = [-0.1 * (i + 1) for i in range(len(act1))]
    lp2 = [-0.1 * (i + 1) for i in range(len(act2))]
    np.testing.assert_allclose(traj.rollout_logprobs,
                               [0] * len(prompt) + lp1 + [0] * len(obs) + lp2, rtol=1e-6)
    versions = [0] * (len(prompt) + len(act1) + len(obs)) + [0, 0] + [1] * (len(act2) - 2)
    assert traj.policy_version.tolist() == versions
    assert (traj.reward, traj.finish, traj.prompt_id) == (1.0, "stop", "p0")
    assert env.actions == ["<python>2+3</python>", "<answer>5</answer>"]
    # Token-in/token-out: the second call continued the exact ids of turn one.
    assert eng.prompts == [prompt, prompt + act1 + obs]
    assert traj.metadata["num_turns"] == 2 and traj.metadata["num_tool_calls"] == 1
    assert validate(traj, vocab_size=TOK.vocab_size, learner_version=1) is None


def test_max_turns_truncates():
    act = enc("<python>1+1</python>")
    eng = ScriptedEngine([act, act])
    traj = asyncio.run(run_episode(eng, CalcEnv(), TOK, {"question": "q"}, SamplingParams(),
                                   max_turns=2, max_total_tokens=512))
    assert traj.finish == "length" and traj.metadata["truncated"] == "max_turns"
    assert traj.reward == 0.0 and traj.action_mask[-1]  # ends on an action, no dangling output


def test_total_token_budget_caps_generation():
    eng = ScriptedEngine([enc("<python>1+1</python>"), enc("<answer>2222222</answer>")])
    prompt = enc("q")
    # Room for the prompt, action 1, its observation and 3 tokens of action 2.
    limit = len(prompt) + 6 + 3 + 3
    traj = asyncio.run(run_episode(eng, CalcEnv(), TOK, {"question": "q"}, SamplingParams(),
                                   max_turns=5, max_total_tokens=limit))
    assert traj.length == limit and traj.finish == "length"
    assert traj.metadata["truncated"] == "max_total_tokens"


def test_eos_ends_episode_and_env_error_is_error():
    eng = ScriptedEngine([[*enc("5"), EOS, 65]])
    traj = asyncio.run(run_episode(eng, CalcEnv(), TOK, {"question": "q"}, SamplingParams(),
                                   max_turns=3, max_total_tokens=64))
    assert traj.finish == "stop" and traj.tokens[-1] == EOS and traj.reward == 1.0
    eng = ScriptedEngine([enc("<python>1</python>")])
    traj = asyncio.run(run_episode(eng, CalcEnv(fail=True), TOK, {"question": "q"},
                                   SamplingParams(), max_turns=3, max_total_tokens=64))
    assert traj.finish == "error" and "sandbox died" in traj.metadata["error"]


def test_prompt_too_long_is_rejected():
    with pytest.raises(ValueError, match="no room"):
        asyncio.run(run_episode(ScriptedEngine([[1]]), CalcEnv(), TOK, {"question": "x" * 10},
                                SamplingParams(), max_turns=1, max_total_tokens=10))


def test_many_episodes_concurrently():
    script = [enc("<answer>5</answer>")] * 12
    trajs = asyncio.run(run_episodes(ScriptedEngine(script, delay_s=0.001), CalcEnv, TOK,
                                     [{"id": i, "question": "q"} for i in range(12)],
                                     SamplingParams(), concurrency=4, max_turns=2,
                                     max_total_tokens=64))
    assert [t.prompt_id for t in trajs] == [str(i) for i in range(12)]
    assert all(t.reward == 1.0 for t in trajs)


def test_multi_turn_trajectory_exact_with_tool_env():
    """Scripted engine + the real sandboxed ToolEnv: every token, mask and version."""
    envs = pytest.importorskip("sao.envs")
    if not envs.sandbox_available():
        pytest.skip("the Python sandbox needs namespaces this machine does not allow")
    from sao.data.prompts import prompt_iterator
    from sao.rollout.show import format_trajectory

    task = envs.make_task("rg/chain_sum", size=4, seed=0)
    prompt = next(prompt_iterator(task.records(), seed=0))
    expr, answer = prompt["entry"]["metadata"]["expression"], prompt["entry"]["answer"]
    act1, act2 = enc(f"<python>print({expr})</python>"), enc(f"<answer>{answer}</answer>")
    eng = ScriptedEngine([act1, ScriptedTurn(act2, swap_to={3: 1})])  # swap inside turn 2
    env = envs.ToolEnv(task, envs.EpisodeConfig(max_turns=4))
    traj = asyncio.run(run_episode(eng, env, TOK, prompt, SamplingParams(max_new_tokens=64),
                                   max_turns=4, max_total_tokens=1024))
    prompt_ids = enc(envs.ToolEnv(task).reset(prompt))
    obs = [OUT, *enc(answer), OUT_END]  # what the sandboxed print() wrote, framed
    assert traj.tokens.tolist() == prompt_ids + act1 + obs + act2
    p, a1, o = len(prompt_ids), len(act1), len(obs)
    assert traj.action_mask.tolist() == [False] * p + [True] * a1 + [False] * o + [True] * len(act2)
    assert traj.policy_version.tolist() == [0] * (p + a1 + o + 3) + [1] * (len(act2) - 3)
    assert eng.prompts == [prompt_ids, prompt_ids + act1 + obs]
    assert (traj.finish, traj.reward, traj.prompt_id) == ("stop", 1.0, prompt["prompt_id"])
    assert traj.metadata["tool_calls"] == 1 and traj.metadata["correct"] == 1.0
    assert validate(traj, vocab_size=TOK.vocab_size, learner_version=1) is None
    table = format_trajectory(traj, TOK)
    assert "'<output>" + answer + "</output>'" in table and table.count(" action ") == 3
    print(table)
