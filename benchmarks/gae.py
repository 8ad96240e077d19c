"""Benchmark: skip-observation GAE, all three solvers, in one run.

    .venv/bin/python benchmarks/gae.py            # B=256, T=4096
    .venv/bin/python benchmarks/gae.py --batch 32 --length 512 --repeats 3

Compares ``sao.algo.gae`` (``method="chunked"``, the default, ``"associative"``,
and ``"scan"``, the literal per-token recursion) against

* the NumPy loop reference (reverse loop over tokens, one row at a time, in
  Python); it is timed on ``--loop_rows`` rows and scaled linearly to B rows;
* a NumPy loop over time vectorised across the batch (all rows);
* a memory-bandwidth reference: a jitted elementwise pass that reads and
  writes the same bytes as GAE (rewards, values, mask in; advantages, returns
  out).

Prints ratios and GB/s; the last line is one JSON object with every figure.
The jitted functions are timed in ``--rounds`` interleaved rounds (bandwidth
reference, then each method, in every round), each figure the median of
``--repeats`` calls after a compile/warm-up call, as wall clock and as process
CPU time (all threads). A ratio against the bandwidth reference is taken
within each round and the median over rounds is reported, so a slow spell on
a shared machine hits both sides of a ratio. Ratios and targets use wall time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from sao.algo import GAE_METHODS, gae


def python_loop_gae(rewards, values, mask, gamma, lam):
    """Reference: per row, reverse loop over tokens (skip-observation GAE)."""
    batch, length = rewards.shape
    adv = np.zeros((batch, length), np.float32)
    for b in range(batch):
        next_a, next_v, pending = 0.0, 0.0, 0.0
        for t in range(length - 1, -1, -1):
            if mask[b, t]:
                delta = rewards[b, t] + pending + gamma * next_v - values[b, t]
                next_a = delta + gamma * lam * next_a
                next_v = values[b, t]
                pending = 0.0
                adv[b, t] = next_a
            else:
                pending += rewards[b, t]
    return adv, np.where(mask, adv + values, 0.0)


def numpy_time_loop_gae(rewards, values, mask, gamma, lam):
    """Reference: reverse loop over time, NumPy-vectorised across rows."""
    batch, length = rewards.shape
    adv = np.zeros((batch, length), np.float32)
    next_a = np.zeros(batch, np.float32)
    next_v = np.zeros(batch, np.float32)
    pending = np.zeros(batch, np.float32)
    for t in range(length - 1, -1, -1):
        m = mask[:, t]
        a = rewards[:, t] + pending + gamma * next_v - values[:, t] + gamma * lam * next_a
        adv[:, t] = np.where(m, a, 0.0)
        next_a = np.where(m, a, next_a)
        next_v = np.where(m, values[:, t], next_v)
        pending = np.where(m, 0.0, pending + rewards[:, t])
    return adv, np.where(mask, adv + values, 0.0)


def make_batch(batch, length, seed=0):
    """Agentic-looking rows: action spans and observation spans of random lengths."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((batch, length), bool)
    for b in range(batch):
        t = int(rng.integers(16, 256))  # prompt
        while t < length:
            span = int(rng.integers(8, 512))
            mask[b, t:t + span] = True
            t += span + int(rng.integers(4, 1024))
    rewards = np.zeros((batch, length), np.float32)
    last = length - 1 - np.argmax(mask[:, ::-1], axis=1)
    rewards[np.arange(batch), last] = rng.random(batch).astype(np.float32)
    rewards += 0.01 * rng.normal(size=(batch, length)).astype(np.float32)  # dense shaping
    values = rng.normal(size=(batch, length)).astype(np.float32)
    return rewards, values, mask


def timeit(fn, repeats):
    """Median wall-clock and CPU (process, all threads) seconds of ``fn()``."""
    fn()  # compile / warm up
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--loop_rows", type=int, default=16)
    args = parser.parse_args()
    gamma, lam = 0.99, 0.95
    rewards, values, mask = make_batch(args.batch, args.length)
    r, v, m = jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask)

    fns = {
        method: jax.jit(lambda r, v, m, method=method: gae(
            r, v, m, gamma=gamma, lam=lam, method=method))
        for method in GAE_METHODS
    }
    bandwidth_ref = jax.jit(lambda r, v, m: (jnp.where(m, r - v, 0.0), jnp.where(m, r + v, 0.0)))
    nbytes = rewards.nbytes + values.nbytes + mask.nbytes + 2 * rewards.nbytes

    ref_adv, _ = numpy_time_loop_gae(rewards, values, mask, gamma, lam)
    rows = slice(0, args.loop_rows)
    loop_adv, _ = python_loop_gae(rewards[rows], values[rows], mask[rows], gamma, lam)
    np.testing.assert_allclose(loop_adv, ref_adv[rows], rtol=1e-4, atol=1e-4)
    for method, fn in fns.items():
        np.testing.assert_allclose(np.asarray(fn(r, v, m)[0]), ref_adv, rtol=1e-4, atol=1e-4)

    t_loop_subset, c_loop_subset = timeit(lambda: python_loop_gae(
        rewards[rows], values[rows], mask[rows], gamma, lam), max(1, args.repeats // 5))
    t_loop = t_loop_subset * args.batch / args.loop_rows
    c_loop = c_loop_subset * args.batch / args.loop_rows
    t_np, c_np = timeit(lambda: numpy_time_loop_gae(rewards, values, mask, gamma, lam),
                        max(1, args.repeats // 5))
    jitted = {"bandwidth_ref": bandwidth_ref, **fns}
    rounds = {name: [] for name in jitted}  # (wall, cpu) per round
    for _ in range(args.rounds):
        for name, fn in jitted.items():
            rounds[name].append(timeit(lambda fn=fn: jax.block_until_ready(fn(r, v, m)),
                                       args.repeats))
    med = statistics.median
    t_bw, c_bw = (med(x[i] for x in rounds["bandwidth_ref"]) for i in (0, 1))
    figures = {
        "backend": jax.default_backend(), "batch": args.batch, "length": args.length,
        "bytes": nbytes, "rounds": args.rounds, "repeats": args.repeats,
        "loop_rows_timed": args.loop_rows, "python_loop_s_scaled": t_loop,
        "python_loop_cpu_s_scaled": c_loop, "numpy_time_loop_s": t_np,
        "bandwidth_ref_s": t_bw, "bandwidth_ref_cpu_s": c_bw,
        "bandwidth_ref_gbps": nbytes / t_bw / 1e9,
    }
    print(f"{'impl':<22}{'wall ms':>9}{'cpu ms':>9}{'GB/s':>8}{'x loop':>8}"
          f"{'x np-vec':>9}{'% bw ref':>9}{'% bw cpu':>9}")
    print(f"{'python loop (scaled)':<22}{t_loop * 1e3:>9.1f}{c_loop * 1e3:>9.1f}"
          f"{nbytes / t_loop / 1e9:>8.3f}")
    print(f"{'numpy time loop':<22}{t_np * 1e3:>9.1f}{c_np * 1e3:>9.1f}{nbytes / t_np / 1e9:>8.3f}")
    print(f"{'bandwidth reference':<22}{t_bw * 1e3:>9.2f}{c_bw * 1e3:>9.2f}"
          f"{nbytes / t_bw / 1e9:>8.2f}")
    for method in fns:
        t, c = (med(x[i] for x in rounds[method]) for i in (0, 1))
        frac = [bw[0] / x[0] for bw, x in zip(rounds["bandwidth_ref"], rounds[method])]
        frac_cpu = [bw[1] / x[1] for bw, x in zip(rounds["bandwidth_ref"], rounds[method])]
        figures.update({
            f"{method}_s": t, f"{method}_cpu_s": c, f"{method}_gbps": nbytes / t / 1e9,
            f"{method}_x_python_loop": t_loop / t, f"{method}_x_python_loop_cpu": c_loop / c,
            f"{method}_x_numpy_time_loop": t_np / t,
            f"{method}_frac_bandwidth_ref": med(frac),
            f"{method}_frac_bandwidth_ref_cpu": med(frac_cpu),
            f"{method}_frac_bandwidth_ref_range": [min(frac), max(frac)],
        })
        print(f"{'gae ' + method:<22}{t * 1e3:>9.2f}{c * 1e3:>9.2f}{nbytes / t / 1e9:>8.2f}"
              f"{t_loop / t:>8.0f}{t_np / t:>9.1f}{100 * med(frac):>8.1f}%"
              f"{100 * med(frac_cpu):>8.1f}%")
    best = min(GAE_METHODS, key=lambda k: figures[f"{k}_s"])
    figures["fastest"] = best
    figures["target_x_loop_100_met"] = figures[f"{best}_x_python_loop"] >= 100
    figures["target_bw_25pct_met"] = figures[f"{best}_frac_bandwidth_ref"] >= 0.25
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
