"""mini-swe-agent, unmodified, drives the policy through the endpoint.

* Importing our adapter (and with it mini-swe-agent and litellm) opens no
  network connection: a fresh interpreter with an audit hook on
  ``socket.connect`` / ``socket.getaddrinfo`` records none.
* An episode with a scripted engine: mini-swe-agent's ``DefaultAgent`` and
  ``LitellmModel`` call the endpoint over HTTP with its ``bash`` tool; its
  commands run in the namespace sandbox; the submit command ends it; the
  trajectory holds both actions (mask True) and the sandbox's output as an
  observation (mask False).
"""
import asyncio
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sao.envs.sandbox import run_python, sandbox_available
from sao.fleet.endpoint import Endpoint, EndpointConfig, harness_episode_fn
from sao.models import gguf_io
from sao.models.tokenizer_loading import load_tokenizer
from sao.rollout.base import SamplingParams
from sao.rollout.scripted import ScriptedEngine, ScriptedTurn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKEN = "test-token-mswea-0123456789"

PROBE = """
import sys
events = []
def hook(event, args):
    if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname"):
        events.append((event, repr(args)[:200]))
sys.addaudithook(hook)
import sao.fleet.endpoint.mswea as m
import litellm, minisweagent
print("EVENTS", events)
print("ENV", {k: __import__("os").environ.get(k) for k in m.OFFLINE_ENV})
"""


def test_import_is_offline(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MSWEA_", "LITELLM_"))}
    env.update(PYTHONPATH=ROOT, HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "EVENTS []" in out.stdout, out.stdout
    assert "'LITELLM_LOCAL_MODEL_COST_MAP': 'True'" in out.stdout
    assert (tmp_path / ".cache" / "sao" / "mini-swe-agent").is_dir()  # its config dir: scratch


class SandboxShell:
    """A workspace without state: each command runs in a fresh namespace sandbox."""

    def __init__(self):
        self.commands = []

    def execute(self, command, cwd="", timeout=30):
        self.commands.append(command)
        code = ("import subprocess, sys\n"
                f"r = subprocess.run(['bash', '-c', {command!r}], capture_output=True, text=True)\n"
                "sys.stdout.write(r.stdout + r.stderr); sys.exit(r.returncode)")
        res = run_python(code, timeout_s=timeout, memory_mb=512)
        return {"returncode": res.exit_code if res.exit_code is not None else -1,
                "output": res.stdout + res.stderr}


def bash_call(tok, command, compact=False):
    args = json.dumps({"command": command}, separators=(",", ":") if compact else None)
    return ScriptedTurn(tok.encode(
        f'I will run a command.\n<tool_call>\n{{"name": "bash", "arguments": {args}}}\n'
        '</tool_call><|im_end|>'))


@pytest.mark.slow   # ~1.5 min on the loaded 2-core machine (litellm's import, the sandbox)
@pytest.mark.skipif(not sandbox_available(), reason="needs the namespace sandbox")
def test_mini_swe_agent_episode_through_the_endpoint(tmp_path):
    from sao.fleet.endpoint.mswea import MiniSweAgentHarness
    tok = load_tokenizer(gguf_io.find_smollm2_gguf())
    # compact JSON arguments: the chat template would render them with spaces
    engine = ScriptedEngine([bash_call(tok, "echo sandboxed-$((6*7))", compact=True),
                             bash_call(tok, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")])
    shells = []

    def make_workspace(prompt):
        shells.append(SandboxShell())
        return shells[-1]

    harness = MiniSweAgentHarness(make_workspace, lambda prompt, ws: (1.0, {"graded": True}),
                                  lambda prompt: prompt["text"], step_limit=4)

    async def main():
        endpoint = Endpoint(engine, tok, EndpointConfig(token=TOKEN,
                                                        record_dir=str(tmp_path / "rec")))
        await endpoint.start()
        try:
            episode = harness_episode_fn(endpoint, harness, SamplingParams(max_new_tokens=128),
                                         max_turns=4, max_total_tokens=4096, timeout_s=300)
            return await episode({"prompt_id": "t0", "text": "Say hello."}), endpoint.stats()
        finally:
            await endpoint.stop()

    traj, stats = asyncio.run(main())
    assert traj.finish == "stop" and traj.reward == 1.0, traj.metadata
    assert traj.metadata["exit_status"] == "Submitted" and traj.metadata["graded"]
    assert traj.metadata["turns"] == 2 and stats["requests"] == 2
    assert shells[0].commands[0].startswith("echo sandboxed")
    # the sandbox's output is an observation between the two actions
    text = tok.decode(traj.tokens.tolist())
    assert "sandboxed-42" in text and "<tool_response>" in text
    runs = np.flatnonzero(np.diff(traj.action_mask.astype(int)) == 1)
    assert len(runs) == 2                              # two separate action spans
    obs = tok.decode(traj.tokens[runs[0] + 1:runs[1] + 1][~traj.action_mask[runs[0] + 1:runs[1] + 1]].tolist())
    assert "sandboxed-42" in obs

    check_recorded_transcript(tmp_path)


def harness_check(*args):
    out = subprocess.run([sys.executable, "-m", "sao.fleet.harness_check", "--json",
                          f"--tokenizer={gguf_io.find_smollm2_gguf()}", *args],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                         capture_output=True, text=True, timeout=300)
    return out.returncode, json.loads(out.stdout)


def check_recorded_transcript(tmp_path):
    """``python -m sao.fleet.harness_check`` on mini-swe-agent's recorded calls."""
    rec = tmp_path / "rec"
    (path,) = list(rec.iterdir())
    rc, summary = harness_check(str(rec))
    assert rc == 0 and summary["calls"] == 2 and summary["prefix_stability"] == 1.0, summary
    assert summary["cut_histories"] == [] and summary["tokens_lost_to_cuts"] == 0
    # re-rendering the model's compact JSON with the template's spacing changes ids
    assert summary["retemplated_tokens"] > 0, summary
    # A harness that rewrites history (here: replaces the model's thought before its
    # tool call; blanking it changed nothing when the model had written none) would be
    # cut there. The rewritten message is the latest action, which the cut keeps (it was
    # sampled in a consistent context): no recorded id is dropped, but the episode loses
    # the second call, its tool output and the second action.
    calls = [json.loads(line) for line in path.read_text().splitlines()]
    calls[1]["request"]["messages"][2]["content"] = "A thought the model never wrote."
    bad = tmp_path / "rewritten.jsonl"
    bad.write_text("".join(json.dumps(c) + "\n" for c in calls))
    rc, summary = harness_check(str(bad))
    assert rc == 1 and summary["prefix_stability"] == 0.5, summary
    (cut,) = summary["cut_histories"]
    assert cut["cut_message"] == 2 and cut["cut_tokens_lost"] == 0
    assert cut["tokens_after_cut"] > 0 and summary["tokens_lost_to_cuts"] == cut["tokens_after_cut"]
    assert summary["errors"] == {"history_rewrite": 1}


@pytest.mark.slow
@pytest.mark.skipif(not sandbox_available(), reason="needs the namespace sandbox")
def test_a_reply_without_a_tool_call_is_dropped_by_mini_swe_agent_and_cut_here():
    """mini-swe-agent 2.4.6 answers a reply without a tool call with a format
    error and leaves the reply out of its history: a rewrite. The episode
    ends there, flagged, keeping the action (sampled in a consistent context)."""
    from sao.fleet.endpoint.mswea import MiniSweAgentHarness
    tok = load_tokenizer(gguf_io.find_smollm2_gguf())
    engine = ScriptedEngine([tok.encode("I am not sure what to do.<|im_end|>"),
                             bash_call(tok, "ls")])
    harness = MiniSweAgentHarness(lambda prompt: SandboxShell(), lambda prompt, ws: (1.0, {}),
                                  lambda prompt: prompt["text"], step_limit=4)

    async def main():
        endpoint = Endpoint(engine, tok, EndpointConfig(token=TOKEN))
        await endpoint.start()
        try:
            episode = harness_episode_fn(endpoint, harness, SamplingParams(max_new_tokens=64),
                                         max_turns=4, max_total_tokens=4096, timeout_s=300)
            return await episode({"prompt_id": "t1", "text": "Fix it."}), endpoint.stats()
        finally:
            await endpoint.stop()

    traj, stats = asyncio.run(main())
    assert traj.finish == "length" and traj.reward == 0.0
    assert traj.metadata["cut"] == "history_rewrite" and traj.metadata["cut_message"] == 2
    assert tok.decode(traj.tokens[traj.action_mask].tolist()) == "I am not sure what to do.<|im_end|>"
    assert stats["error/history_rewrite"] == 1 and len(engine.prompts) == 1
