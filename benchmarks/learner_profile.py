"""Per-fusion profile of one learner step: which XLA thunks take the wall time.

    cd benchmarks && ../.venv/bin/python learner_profile.py                  # 50m, mixed_bf16head
    cd benchmarks && ../.venv/bin/python learner_profile.py --precision f32 --top 40

Runs `learner_step.py`'s forward+backward (``--config``, ``--precision``)
under ``jax.profiler`` for ``--steps`` steps and reads the Perfetto trace: every
event named after an HLO instruction of the compiled step is one thunk
(a matmul fusion, an elementwise fusion, a copy). XLA:CPU runs independent
thunks concurrently, so each instant of wall time is split evenly among the
thunks running then ("wall share"); the shares sum to the step's busy time.
Thunks are grouped by kind (LM head products, decoder products and weight
gradients, attention, the rest) and listed by HLO op name and shape, with
the op's source in the JAX program (``metadata op_name``). Prints a table
and, last, one JSON line. Used to find what to change in
`sao/models/` (benchmarks/README.md, learner step).
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from learner_step import CONFIGS, PRECISIONS, cpu_description
from sao.models import Transformer, token_logprobs


def hlo_ops(hlo_text: str) -> dict[str, tuple[str, str]]:
    """Instruction name -> (shape, JAX op_name) for every instruction in ``hlo_text``."""
    ops = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%(\S+) = (\S+) .*$", hlo_text, re.M):
        op = re.search(r'op_name="([^"]*)"', m.group(0))
        ops[m.group(1)] = (m.group(2).split("{")[0], op.group(1) if op else "")
    return ops


def wall_shares(events: list[dict]) -> list[float]:
    """Each complete event's share of wall time (microseconds): every instant
    is divided evenly among the events running at it."""
    edges = sorted([(e["ts"], 1, i) for i, e in enumerate(events)]
                   + [(e["ts"] + e["dur"], -1, i) for i, e in enumerate(events)])
    share, active, last = [0.0] * len(events), set(), None
    for ts, kind, i in edges:
        if last is not None and active:
            for j in active:
                share[j] += (ts - last) / len(active)
        last = ts
        (active.add if kind == 1 else active.discard)(i)
    return share


def kind(name: str, op: str) -> str:
    """Coarse class of a thunk from its HLO name and JAX op_name."""
    if "while" in op:
        return "head products" if name.startswith("ynn") else "head elementwise"
    if not name.startswith("ynn"):
        return "elementwise and copies"
    if re.search(r"btkg|bskd|reduce", op):
        return "attention products"
    return "decoder weight gradients" if "branch_0_fun" in op else "decoder products"


def profile(config: str, precision: str, steps: int) -> tuple[dict, list]:
    mcfg, b, t = CONFIGS[config]
    dtype, head_dtype = PRECISIONS[precision]
    graphdef, params = nnx.split(Transformer(mcfg.replace(dtype=dtype, head_dtype=head_dtype),
                                             rngs=nnx.Rngs(0)))
    x = jnp.asarray(np.random.default_rng(0).integers(0, mcfg.vocab_size, (b, t)), jnp.int32)
    step = jax.jit(jax.value_and_grad(
        lambda p: -jnp.mean(token_logprobs(nnx.merge(graphdef, p), x)[:, 1:])))
    ops = hlo_ops(step.lower(params).compile().as_text())
    for _ in range(2):
        jax.block_until_ready(step(params))
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d, create_perfetto_trace=True)
        for _ in range(steps):
            jax.block_until_ready(step(params))
        jax.profiler.stop_trace()
        path = glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True)[0]
        with gzip.open(path) as f:
            trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("name") in ops]
    if not events:
        raise RuntimeError("the trace holds no thunk events (is this jaxlib's CPU profiler on?)")
    shares = wall_shares(events)
    by_kind, by_op = collections.Counter(), collections.Counter()
    count = collections.Counter()
    for e, s in zip(events, shares):
        shape, op = ops[e["name"]]
        by_kind[kind(e["name"], op)] += s / steps / 1e3
        key = (re.sub(r"\.\d+$", "", e["name"]), shape, re.sub(r"^jit\([^)]*\)/", "", op))
        by_op[key] += s / steps / 1e3
        count[key] += 1
    rows = [(round(ms, 1), count[k] // steps) + k for k, ms in by_op.most_common()]
    return {k: round(v, 1) for k, v in by_kind.most_common()}, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="50m", choices=sorted(CONFIGS))
    ap.add_argument("--precision", default="mixed_bf16head", choices=sorted(PRECISIONS))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    by_kind, rows = profile(args.config, args.precision, args.steps)
    print(f"wall ms per step by kind ({args.config}, {args.precision}):")
    for k, ms in by_kind.items():
        print(f"  {ms:8.1f}  {k}")
    print("top thunks: wall ms per step, count per step, HLO name, shape, JAX op")
    for ms, n, name, shape, op in rows[:args.top]:
        print(f"  {ms:7.1f} {n:4d}  {name:26s} {shape:24s} {op[:70]}")
    print(json.dumps({"benchmark": "learner_profile", "config": args.config,
                      "precision": args.precision, "cpu": cpu_description(),
                      "busy_ms_per_step": round(sum(by_kind.values()), 1),
                      "wall_ms_by_kind": by_kind, "top": rows[:args.top]}))


if __name__ == "__main__":
    main()
