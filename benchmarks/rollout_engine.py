"""JaxEngine continuous batching vs static batched `generate`, long-tailed lengths.

    .venv/bin/python benchmarks/rollout_engine.py

Same model (`tiny` preset), same requests: N prompts of 8-40 random bytes,
each with its own generation budget drawn log-normal (median 24 tokens,
sigma 1, capped at 256), no stop tokens, so every request generates exactly
its budget. The reference serves them in arrival order in static batches of
`slots` through `sao.models.generate`, where a batch lasts as long as its
longest member (budget rounded up to a power of two to bound recompiles).
`JaxEngine` serves them through `slots` continuously refilled rows. Both are
warmed up on the same workload first (compiles excluded), then run
alternately ``--repeats`` times; the best time of each counts (the machine is
shared). Prints one JSON line: useful tokens/s of each, the ratio
static_s / engine_s (> 1: the engine is faster), and the mean time from the
start until a request is answered (static: when its batch ends), which is
what an agent loop waits before its next turn.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

import jax
import numpy as np
from flax import nnx

from sao.models import Transformer, generate, get_preset
from sao.rollout import SamplingParams
from sao.rollout.jax_engine import JaxEngine


def workload(n, seed):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 256, size=int(rng.integers(8, 41))).tolist() for _ in range(n)]
    budgets = np.minimum(256, np.maximum(1, rng.lognormal(np.log(24), 1.0, n))).astype(int)
    return prompts, budgets.tolist()


def run_static(model, prompts, budgets, slots):
    """Returns (useful tokens, mean seconds from start until a request's batch ended)."""
    tokens, t0, latencies = 0, time.perf_counter(), []
    for i in range(0, len(prompts), slots):
        group, need = prompts[i:i + slots], budgets[i:i + slots]
        width = max(len(p) for p in group)
        batch = np.zeros((len(group), width), np.int32)
        for r, p in enumerate(group):
            batch[r, :len(p)] = p
        max_new = 1 << (max(need) - 1).bit_length()
        out = generate(model, batch, np.array([len(p) for p in group], np.int32),
                       rng=jax.random.key(i), max_new_tokens=max_new)
        jax.block_until_ready(out.tokens)
        tokens += sum(need)  # only the requested tokens are useful
        latencies += [time.perf_counter() - t0] * len(group)
    return tokens, float(np.mean(latencies))


async def run_engine(engine, prompts, budgets):
    """Returns (generated tokens, mean seconds from start until a request completed)."""
    t0 = time.perf_counter()

    async def one(p, b):
        c = await engine.generate(p, SamplingParams(max_new_tokens=b))
        return len(c.tokens), time.perf_counter() - t0
    outs = await asyncio.gather(*(one(p, b) for p, b in zip(prompts, budgets)))
    return sum(n for n, _ in outs), float(np.mean([t for _, t in outs]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--decode_chunk", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--preset", default="tiny")
    args = ap.parse_args()
    cfg = get_preset(args.preset)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    prompts, budgets = workload(args.requests, 0)
    engine = JaxEngine(model, max_slots=args.slots, max_len=320,
                       decode_chunk=args.decode_chunk)
    engine_s, static_s, engine_lat, static_lat = [], [], [], []

    async def serve():
        await run_engine(engine, prompts, budgets)  # warm-up: compiles
        run_static(model, prompts, budgets, args.slots)  # warm-up: compiles
        for _ in range(args.repeats):  # alternate, keep the best of each (shared machine)
            t0 = time.perf_counter()
            n_engine, lat = await run_engine(engine, prompts, budgets)
            engine_s.append(time.perf_counter() - t0)
            engine_lat.append(lat)
            t0 = time.perf_counter()
            n_static, lat = run_static(model, prompts, budgets, args.slots)
            static_s.append(time.perf_counter() - t0)
            static_lat.append(lat)
        await engine.close()
        return n_engine, n_static
    engine_tokens, static_tokens = asyncio.run(serve())
    engine_s, static_s = min(engine_s), min(static_s)
    assert engine_tokens == static_tokens == sum(budgets)
    budgets_arr = np.asarray(budgets)
    print(json.dumps({
        "benchmark": "rollout_engine", "requests": args.requests, "slots": args.slots,
        "decode_chunk": args.decode_chunk,
        "tokens": int(engine_tokens), "p99_over_p50": round(float(
            np.percentile(budgets_arr, 99) / np.percentile(budgets_arr, 50)), 2),
        "engine_s": round(engine_s, 3), "static_s": round(static_s, 3),
        "engine_tokens_per_s": round(engine_tokens / engine_s, 1),
        "static_tokens_per_s": round(static_tokens / static_s, 1),
        "ratio": round(static_s / engine_s, 3),
        "engine_mean_latency_s": round(min(engine_lat), 3),
        "static_mean_latency_s": round(min(static_lat), 3),
        "latency_ratio": round(min(static_lat) / min(engine_lat), 3)}))


if __name__ == "__main__":
    main()
