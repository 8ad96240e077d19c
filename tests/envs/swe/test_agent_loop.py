"""A micro task under the real agent loop (scripted engine, byte tokenizer):
the scripted demonstration's actions earn reward 1, and the trajectory's
text is exactly the demonstration (so SFT on demonstrations sees what RL
episodes look like)."""
from __future__ import annotations

import asyncio

from sao.envs import EpisodeConfig
from sao.envs.swe import SweEnv, SweTask
from sao.envs.swe.demos import demonstration
from sao.models.tokenizer import ByteTokenizer
from sao.rollout import SamplingParams, ScriptedEngine, run_episode


def test_demonstration_replayed_through_the_agent_loop(micro_entries):
    entry = micro_entries[0]
    demo = demonstration(entry, fmt="tags")
    tok = ByteTokenizer()
    engine = ScriptedEngine([tok.encode(text) for text, is_action in demo.spans if is_action])
    task = SweTask("swe/micro", [entry])
    env = SweEnv(task, EpisodeConfig(tool_format="tags", max_turns=8, max_tool_calls=6,
                                     tool_timeout_s=30.0, max_observation_chars=2000))
    traj = asyncio.run(run_episode(engine, env, tok, task.records()[0],
                                   SamplingParams(max_new_tokens=256), max_turns=8,
                                   max_total_tokens=8192))
    assert traj.reward == 1.0 and traj.metadata["correct"] == 1.0
    assert traj.metadata["end"] == "submit" and traj.metadata["tool_calls"] == 2
    assert tok.decode(traj.tokens) == demo.prompt + demo.response_text
    actions = sum(len(tok.encode(t)) for t, is_action in demo.spans if is_action)
    assert int(traj.action_mask.sum()) == actions
