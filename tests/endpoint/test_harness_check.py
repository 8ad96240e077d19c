"""``harness_check``'s cut accounting on transcripts the endpoint recorded.

A real endpoint (aiohttp on 127.0.0.1, SmolLM2's tokenizer, a scripted
engine) records an honest three-call episode; copies of it with a rewritten
history are replayed. What a cut costs is the ids the session had recorded
and dropped (``cut_tokens_lost``) plus those the later calls would have added
(``tokens_after_cut``): together with the ids the cut trajectory keeps they
make up exactly the honest episode's ids, whichever message was rewritten,
including the latest action, which the cut keeps (docs/rollout.md).
"""
import asyncio
import copy
import json

import pytest

from sao.fleet.endpoint import Endpoint, EndpointConfig
from sao.fleet.endpoint.dialect import dialect_for
from sao.fleet.endpoint.reference import ChatClient
from sao.fleet.endpoint.transcripts import replay_all
from sao.fleet.harness_check import report_text, summarize
from sao.models import gguf_io
from sao.models.tokenizer_loading import load_tokenizer
from sao.rollout.base import SamplingParams
from sao.rollout.scripted import ScriptedEngine, ScriptedTurn

TOKEN = "test-token-harness-check-0123456789"
BASH = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(gguf_io.find_smollm2_gguf())


@pytest.fixture(scope="module")
def honest(tok, tmp_path_factory):
    """The calls of an honest episode recorded by the endpoint: 3 calls, each
    answered with a thought and a ``bash`` call."""
    rec = tmp_path_factory.mktemp("rec")
    engine = ScriptedEngine([ScriptedTurn(tok.encode(
        f'I will look at step {i}.\n<tool_call>\n{{"name": "bash", "arguments": '
        f'{{"command": "ls {i}"}}}}\n</tool_call><|im_end|>')) for i in range(3)])

    async def main():
        endpoint = Endpoint(engine, tok, EndpointConfig(token=TOKEN, record_dir=str(rec)))
        await endpoint.start()
        try:
            s = endpoint.open_session(SamplingParams(max_new_tokens=64), max_turns=8,
                                      max_total_tokens=4096)
            client = ChatClient(endpoint.base_url(s), TOKEN)
            messages = [{"role": "system", "content": "You fix bugs."},
                        {"role": "user", "content": "Fix the bug."}]
            for i in range(3):
                reply = await client.complete(messages, [BASH])
                messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                                     "content": f"output of step {i}"}]
        finally:
            await endpoint.stop()

    asyncio.run(main())
    (path,) = list(rec.iterdir())
    return [json.loads(line) for line in path.read_text().splitlines()]


def check(tok, calls, tmp_path, name):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in calls))
    (report,) = replay_all([str(path)], tok, dialect_for(tok))
    return report, summarize([report])


def rewrite(calls, first_call, message, content):
    """A harness that, from call ``first_call`` on, sends ``content`` as ``messages[message]``."""
    calls = copy.deepcopy(calls)
    for call in calls[first_call:]:
        call["request"]["messages"][message]["content"] = content
    return calls


def test_honest_transcript_has_no_cut(tok, honest, tmp_path):
    report, summary = check(tok, honest, tmp_path, "honest")
    assert summary["prefix_stability"] == 1.0 and summary["cut_histories"] == []
    assert summary["tokens_lost_to_cuts"] == 0 and report.tito_tokens > 0


@pytest.mark.parametrize("first_call,message,dropped", [
    (1, 2, False),   # the model's first action (its thought) rewritten: that action stays
    (2, 3, True),    # the first tool output summarised: the second action is dropped
])
def test_a_cut_counts_what_it_drops_and_what_the_later_calls_add(
        tok, honest, tmp_path, first_call, message, dropped):
    whole = check(tok, honest, tmp_path, "honest")[0].tito_tokens
    report, summary = check(tok, rewrite(honest, first_call, message, "Something else."),
                            tmp_path, "rewritten")
    (cut,) = summary["cut_histories"]
    assert (cut["cut_call"], cut["cut_message"]) == (first_call, message), cut
    assert summary["errors"] == {"history_rewrite": 1}
    # the replay stops at the cut: the calls before it were stable
    assert (summary["calls"], summary["stable_calls"]) == (first_call + 1, first_call)
    assert (cut["cut_tokens_lost"] > 0) == dropped
    assert cut["tokens_after_cut"] > 0
    # kept + dropped + never reached = the honest episode, id for id
    assert report.tito_tokens + cut["cut_tokens_lost"] + cut["tokens_after_cut"] == whole
    assert summary["tokens_lost_to_cuts"] == cut["cut_tokens_lost"] + cut["tokens_after_cut"]
    text = report_text(summary)
    assert f"call {first_call}, message {message}" in text
    assert f"{cut['tokens_after_cut']} tokens of later calls never reached" in text
