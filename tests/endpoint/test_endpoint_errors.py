"""Bad input from a harness gets a clear error and loses no other episode.

Each case runs against a real endpoint (aiohttp on 127.0.0.1, SmolLM2's
tokenizer, a scripted engine) while a second session holds an episode in
progress; after the bad call that second episode still completes and yields
its trajectory.
"""
import asyncio
import json

import numpy as np
import pytest

from sao.fleet.endpoint import Endpoint, EndpointConfig, harness_episode_fn
from sao.fleet.endpoint.reference import ChatClient, EndpointError
from sao.fleet.endpoint.episode import HarnessResult
from sao.models import gguf_io
from sao.models.tokenizer_loading import load_tokenizer
from sao.rollout.base import SamplingParams
from sao.rollout.scripted import ScriptedEngine, ScriptedTurn

TOKEN = "test-token-abcdef0123456789"
BASH = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
SYSTEM = {"role": "system", "content": "You fix bugs."}
USER = {"role": "user", "content": "Fix the bug."}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(gguf_io.find_smollm2_gguf())


def call_turn(tok, cmd="ls"):
    return ScriptedTurn(tok.encode(
        f'<tool_call>\n{{"name": "bash", "arguments": {{"command": "{cmd}"}}}}\n</tool_call><|im_end|>'))


class Fixture:
    """An endpoint with a scripted engine that always calls ``bash ls``."""

    def __init__(self, tok, delay_s=0.0):
        self.engine = ScriptedEngine([call_turn(tok)] * 200, delay_s=delay_s)
        self.endpoint = Endpoint(self.engine, tok, EndpointConfig(token=TOKEN,
                                                                  max_body_bytes=1 << 20))
        self.sampling = SamplingParams(max_new_tokens=64, stop_token_ids=(tok.eos_id,))

    def session(self, **kw):
        s = self.endpoint.open_session(self.sampling, max_turns=kw.get("max_turns", 8),
                                       max_total_tokens=kw.get("max_total_tokens", 2048))
        return s, ChatClient(self.endpoint.base_url(s), TOKEN)


async def turns(client, n, messages=None):
    """``n`` honest calls; returns the conversation so far."""
    messages = list(messages or [SYSTEM, USER])
    for _ in range(n):
        reply = await client.complete(messages, [BASH])
        messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                             "content": '{"returncode": 0, "output": "a.py"}'}]
    return messages


async def with_endpoint(tok, body, **kw):
    f = Fixture(tok, **kw)
    await f.endpoint.start()
    try:
        return await body(f)
    finally:
        await f.endpoint.stop()


async def bystander_survives(f, bad):
    """Runs ``bad(f)`` while another session is mid-episode; checks that one finishes."""
    other, client = f.session()
    messages = await turns(client, 1)
    result = await bad(f)
    await turns(client, 1, messages)
    traj = other.trajectory(1.0, prompt_id="other")
    assert traj.finish == "stop" and traj.reward == 1.0 and traj.num_action_tokens > 0
    return result


def test_token_required_and_checked(tok):
    with pytest.raises(ValueError, match="token"):
        EndpointConfig(token="")

    async def body(f):
        s, _ = f.session()
        for key in ("", "wrong-token"):
            with pytest.raises(EndpointError) as e:
                await ChatClient(f.endpoint.base_url(s), key).complete([USER], [BASH])
            assert e.value.status == 401 and e.value.code == "invalid_api_key"
        assert not f.engine.prompts        # nothing sampled for a caller without the token
    asyncio.run(with_endpoint(tok, body))


def test_malformed_json_and_bad_fields(tok):
    async def bad(f):
        s, client = f.session()
        status, out = await client.post_raw(b'{"messages": [')
        assert status == 400 and out["error"]["code"] == "invalid_json"
        for body, code in [({"messages": "hi"}, "invalid_request"),
                           ({"messages": [{"role": "wizard", "content": "x"}]}, "unknown_role"),
                           ({"messages": [USER], "stream": True}, "streaming_unsupported"),
                           ({"messages": [USER], "max_tokens": -3}, "invalid_request"),
                           ([1, 2], "invalid_request")]:
            status, out = await client.post_raw(json.dumps(body).encode())
            assert (status, out["error"]["code"]) == (400, code), body
        await turns(client, 1)             # the same session still works after refusals
        return s
    s = asyncio.run(with_endpoint(tok, lambda f: bystander_survives(f, bad)))
    assert s.counts["turns"] == 1


def test_unknown_tool(tok):
    async def bad(f):
        _, client = f.session()
        with pytest.raises(EndpointError) as e:
            await client.complete([USER], [BASH], tool_choice={
                "type": "function", "function": {"name": "rm_rf"}})
        assert (e.value.status, e.value.code) == (400, "unknown_tool")
        with pytest.raises(EndpointError) as e:
            await client.complete([USER, {"role": "tool", "tool_call_id": "call_x",
                                          "content": "hi"}], [BASH])
        assert (e.value.status, e.value.code) == (400, "unknown_tool_call")
    asyncio.run(with_endpoint(tok, lambda f: bystander_survives(f, bad)))


def test_session_reused_after_its_end_and_unknown_session(tok):
    async def bad(f):
        s, client = f.session()
        await turns(client, 1)
        s.trajectory(0.0, prompt_id="x")
        f.endpoint.close_session(s)
        with pytest.raises(EndpointError) as e:
            await client.complete([SYSTEM, USER], [BASH])
        assert (e.value.status, e.value.code) == (404, "unknown_session")
        s2, client2 = f.session(max_turns=1)
        messages = await turns(client2, 1)
        for _ in range(2):   # over the turn budget: the session ends, then stays ended
            with pytest.raises(EndpointError) as e:
                await client2.complete(messages, [BASH])
        assert (e.value.status, e.value.code) == (404, "session_ended")
        assert s2.trajectory(1.0, prompt_id="y").finish == "length"
    asyncio.run(with_endpoint(tok, lambda f: bystander_survives(f, bad)))


def test_100_mib_message_is_refused_without_reading_it(tok):
    async def bad(f):
        s, client = f.session()
        huge = {"messages": [{"role": "user", "content": "x" * (100 * 1024 * 1024)}]}
        status, out = await client.post_raw(json.dumps(huge).encode())
        assert (status, out["error"]["code"]) == (413, "body_too_large")
        await turns(client, 1)
        return f.endpoint.counters
    counters = asyncio.run(with_endpoint(tok, lambda f: bystander_survives(f, bad)))
    assert counters["error/body_too_large"] == 1


def test_history_rewrite_cuts_the_trajectory_at_the_first_difference(tok):
    async def bad(f):
        s, client = f.session()
        messages = await turns(client, 2)
        n_before = len(s.traj.tokens)
        ends = list(s.action_ends)
        rewritten = [dict(m) for m in messages]
        rewritten[3] = {**rewritten[3], "content": "a summary of what the tool said"}
        with pytest.raises(EndpointError) as e:
            await client.complete(rewritten, [BASH])
        assert (e.value.status, e.value.code) == (400, "history_rewrite")
        traj = s.trajectory(1.0, prompt_id="cut")
        return traj, ends, n_before
    traj, ends, n_before = asyncio.run(with_endpoint(tok, lambda f: bystander_survives(f, bad)))
    # messages[3] is the first tool result: the trajectory ends with the first action
    assert traj.length == ends[0] and traj.finish == "length" and traj.reward == 0.0
    assert traj.action_mask[-1] and traj.metadata["cut"] == "history_rewrite"
    assert traj.metadata["cut_message"] == 3 and traj.metadata["cut_tokens_lost"] > 0


def test_retry_gets_the_same_answer_and_concurrent_call_is_refused(tok):
    async def body(f):
        s, client = f.session()
        first = await client.complete([SYSTEM, USER], [BASH])
        again = await client.complete([SYSTEM, USER], [BASH])
        assert again == first and s.counts["retries"] == 1 and len(f.engine.prompts) == 1
        messages = [SYSTEM, USER, first, {"role": "tool", "content": "ok",
                                          "tool_call_id": first["tool_calls"][0]["id"]}]
        results = await asyncio.gather(client.complete(messages, [BASH]),
                                       client.complete(messages, [BASH]),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, EndpointError)]
        assert len(errors) == 1 and errors[0].code == "session_busy"
        assert s.trajectory(1.0, prompt_id="r").num_action_tokens > 0
    asyncio.run(with_endpoint(tok, body, delay_s=0.01))


def test_harness_timeout_and_failure_end_the_episode_cleanly(tok):
    class Slow:
        async def run(self, prompt, base_url, api_key):
            await turns(ChatClient(base_url, api_key), 1)
            await asyncio.sleep(30)

    class Broken:
        async def run(self, prompt, base_url, api_key):
            await turns(ChatClient(base_url, api_key), 1)
            raise RuntimeError("harness crashed")

    async def body(f):
        out = {}
        for name, harness in (("slow", Slow()), ("broken", Broken())):
            episode = harness_episode_fn(f.endpoint, harness, f.sampling, max_turns=4,
                                         max_total_tokens=2048, timeout_s=2.0)
            out[name] = await episode({"prompt_id": name})
        return out, dict(f.endpoint.counters), len(f.endpoint.sessions)
    out, counters, still_open = asyncio.run(with_endpoint(tok, body))
    assert out["slow"].finish == "length" and out["slow"].metadata["endpoint_end"] == "timeout"
    assert out["broken"].finish == "error" and "crashed" in out["broken"].metadata["harness_error"]
    assert counters["harness_timeouts"] == 1 and counters["harness_errors"] == 1
    assert still_open == 0
    assert all(np.all(t.rollout_logprobs[~t.action_mask] == 0) for t in out.values())


def test_engine_failure_is_an_error_object_and_ends_only_that_session(tok):
    async def bad(f):
        s, client = f.session()
        engine, f.endpoint.engine = f.engine, None
        s.engine = ScriptedEngine([])              # exhausted: raises EngineError
        with pytest.raises(EndpointError) as e:
            await client.complete([SYSTEM, USER], [BASH])
        f.endpoint.engine = engine
        assert (e.value.status, e.value.code) == (500, "engine_error") and s.ended == "engine_error"
    asyncio.run(with_endpoint(tok, lambda f: bystander_survives(f, bad)))
