"""The environments under the rollout agent loop (scripted engine, byte tokenizer)."""
import asyncio

import numpy as np
import pytest

from sao.data.prompts import prompt_iterator
from sao.envs import EpisodeConfig, ToolEnv, make_task, sandbox_available
from sao.models.tokenizer import ByteTokenizer
from sao.rollout import SamplingParams, ScriptedEngine, run_episode

pytestmark = pytest.mark.skipif(not sandbox_available(), reason="sandbox unavailable here")


def test_tool_episode_through_the_agent_loop():
    tok = ByteTokenizer()
    task = make_task("rg/chain_sum", size=4, seed=0)
    prompt = next(prompt_iterator(task.records(), seed=0))
    expr, answer = prompt["entry"]["metadata"]["expression"], prompt["entry"]["answer"]
    engine = ScriptedEngine([
        tok.encode(f"<python>print({expr})</python>"),
        tok.encode(f"<answer>{answer}</answer>"),
    ])
    env = ToolEnv(task, EpisodeConfig(max_turns=4))
    traj = asyncio.run(run_episode(engine, env, tok, prompt, SamplingParams(max_new_tokens=64),
                                   max_turns=4, max_total_tokens=1024))
    assert traj.finish == "stop" and traj.reward == 1.0
    assert traj.prompt_id == prompt["prompt_id"]
    assert traj.metadata["tool_calls"] == 1 and traj.metadata["correct"] == 1.0
    text = tok.decode(traj.tokens)
    assert f"<output>{answer}</output>" in text           # the tool ran and was framed
    # Observation tokens are context, not actions.
    obs_start = text.index("<output>")
    obs_len = len(tok.encode(f"<output>{answer}</output>"))
    prefix_len = len(tok.encode(text[:obs_start]))
    assert not np.any(traj.action_mask[prefix_len:prefix_len + obs_len])
    assert traj.action_mask.sum() == len(engine._script[0].tokens) + len(engine._script[1].tokens)
