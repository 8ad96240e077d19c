"""Cost of the Python tool sandbox relative to an unsandboxed interpreter.

    .venv/bin/python benchmarks/sandbox_overhead.py [--runs 10] [--concurrency 8]

Reference (same run, same interpreter): ``python -I -B -c CODE`` as a plain
subprocess. Measured: sequential ``run_python`` of the same code, and
``--concurrency`` simultaneous ``run_python_async`` calls (throughput). Ends
with one JSON line: mean seconds per call of each and the ratios
sandbox/plain (latency) and concurrent speed-up over sequential sandbox runs.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

from sao.envs.sandbox import run_python, run_python_async

CODE = "print(sum(i * i for i in range(1000)))"


def plain(runs: int) -> float:
    t0 = time.perf_counter()
    for _ in range(runs):
        subprocess.run([sys.executable, "-I", "-B", "-c", CODE], check=True, capture_output=True)
    return (time.perf_counter() - t0) / runs


def sandboxed(runs: int) -> float:
    t0 = time.perf_counter()
    for _ in range(runs):
        assert run_python(CODE).ok
    return (time.perf_counter() - t0) / runs


def concurrent(runs: int, concurrency: int) -> float:
    async def main():
        sem = asyncio.Semaphore(concurrency)

        async def one():
            async with sem:
                assert (await run_python_async(CODE)).ok
        await asyncio.gather(*(one() for _ in range(runs)))
    t0 = time.perf_counter()
    asyncio.run(main())
    return (time.perf_counter() - t0) / runs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    plain(2), sandboxed(2)                                    # warm the page cache
    p, s = plain(args.runs), sandboxed(args.runs)
    c = concurrent(args.runs * 2, args.concurrency)
    print(f"plain python:        {p * 1e3:7.1f} ms/call")
    print(f"sandboxed:           {s * 1e3:7.1f} ms/call  ({s / p:.2f}x plain)")
    print(f"sandboxed, {args.concurrency} at once: {c * 1e3:7.1f} ms/call  "
          f"({s / c:.2f}x sequential throughput)")
    print(json.dumps({"plain_s": p, "sandbox_s": s, "sandbox_concurrent_s": c,
                      "sandbox_over_plain": s / p, "concurrent_speedup": s / c}))


if __name__ == "__main__":
    main()
