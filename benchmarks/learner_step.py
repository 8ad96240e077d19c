"""Benchmark: learner forward+backward tokens/s, SAO (JAX) vs transformers (PyTorch).

    .venv/bin/python benchmarks/learner_step.py                      # tiny and 50m
    .venv/bin/python benchmarks/learner_step.py --configs 50m --repeats 7

For each config (``tiny``: the preset, 0.43M parameters, byte vocabulary;
``50m``: a Qwen3 of ~48M parameters, d=512, 10 layers, vocab 32768, tied
embeddings), in one run and on the same random weights and tokens:

* ours, ``jax.jit(jax.value_and_grad(loss))`` where ``loss`` is next-token
  cross-entropy from `sao.models.token_logprobs` (the learner's path: float32
  head and log-softmax, chunked over time), gradients w.r.t. every parameter
  (float32), in three precisions: ``f32`` (compute dtype float32), ``mixed``
  (float32 parameters, bfloat16 compute: the model config's
  ``dtype="bfloat16"``; head and log-softmax stay float32) and
  ``mixed_bf16head`` (as ``mixed`` with ``head_dtype="bfloat16"``: the head
  matmul takes bf16 operands, accumulates and returns f32 logits; the
  log-softmax stays float32);
* reference: the same weights exported with `sao.models.save_pretrained`,
  loaded by ``transformers`` (float32 parameters, default SDPA attention),
  ``loss = cross_entropy(logits[:, :-1], tokens[:, 1:])`` then
  ``loss.backward()``, at each ``--torch_threads`` intra-op thread count, in
  float32 (``f32``), under ``torch.autocast("cpu", dtype=torch.bfloat16)``
  (``bf16``, its LM head in bf16 too) and under autocast with the LM head and
  log-softmax in float32 as ours (``bf16_f32head``).

After one warm-up (compile) step each, ``--repeats`` rounds run every variant
once, interleaved, so load from other processes hits all alike. Tokens/s are
from median step times. ``ratio`` is the headline: the median over rounds of
(reference's best setting step time / our best precision's step time), where
"best" is the lowest median (> 1: ours faster); ``ratio_f32`` compares ours
in f32 with the reference's best f32 setting, ``ratio_mixed`` ours mixed
with its best bf16-autocast setting, ``ratio_bf16_head`` ours
mixed_bf16head with the same (both heads take bf16 operands),
``ratio_f32_head`` our best with an f32 head with the reference's best
setting whose LM head runs in f32, and
``cpu_ratio`` the headline by process CPU time (steadier than wall time on a
shared machine). Every variant's loss is printed (f32 ones agree to ~1e-6;
bf16 ones within ~1e-4 relative). The CPU model and its bf16/AMX flags, the
``XLA_FLAGS`` in effect and the load average are recorded. The last line is
one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sao.models import ModelConfig, Transformer, get_preset, save_pretrained, token_logprobs

CONFIGS = {
    "tiny": (get_preset("tiny"), 8, 256),
    "50m": (ModelConfig(arch="qwen3", vocab_size=32768, hidden_size=512, num_layers=10,
                        num_heads=8, num_kv_heads=4, head_dim=64, intermediate_size=1536,
                        rope_theta=10_000.0, tie_word_embeddings=True), 4, 256),
}
# ours: name -> (compute dtype, LM head operand dtype); logits and log-softmax are f32 in all.
PRECISIONS = {"f32": ("float32", "float32"), "mixed": ("bfloat16", "float32"),
              "mixed_bf16head": ("bfloat16", "bfloat16")}
TORCH_PRECISIONS = ("f32", "bf16", "bf16_f32head")


def ours_step(model, tokens: np.ndarray, dtype: str = "float32", head_dtype: str = "float32"):
    """A callable running one jitted forward+backward of ``model``'s weights
    with compute dtype ``dtype`` and LM head operands in ``head_dtype``; returns the loss."""
    cfg = model.cfg.replace(dtype=dtype, head_dtype=head_dtype)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    params = nnx.state(model)

    def loss_fn(params, tokens):
        lp = token_logprobs(nnx.merge(graphdef, params), tokens)
        return -jnp.mean(lp[:, 1:])

    step = jax.jit(jax.value_and_grad(loss_fn))
    x = jnp.asarray(tokens, jnp.int32)

    def run() -> float:
        loss, grads = step(params, x)
        jax.block_until_ready(grads)
        return float(loss)

    return run


def reference_step(path: str, tokens: np.ndarray, threads: int, precision: str):
    """transformers model from ``path``: one forward+backward on ``threads``
    intra-op threads; ``precision``: "f32", "bf16" (``torch.autocast`` bf16,
    the LM head included) or "bf16_f32head" (autocast for the decoder, the LM
    head and log-softmax in f32 as in ours). Returns the loss."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    x = torch.tensor(tokens, dtype=torch.long)

    def run() -> float:
        torch.set_num_threads(threads)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "f32"):
            if precision == "bf16_f32head":
                hidden = model.model(x).last_hidden_state
            else:
                logits = model(x).logits
        if precision == "bf16_f32head":
            logits = torch.nn.functional.linear(hidden.float(), model.lm_head.weight)
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1))
        loss.backward()
        for p in model.parameters():
            p.grad = None
        return float(loss.detach())

    return run


def cpu_description() -> dict:
    """Model name and the matmul-relevant ISA flags of this CPU (Linux)."""
    out = {"model": "unknown", "cores": os.cpu_count(), "flags": []}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and out["model"] == "unknown":
            out["model"] = value.strip()
        elif key.strip() == "flags":
            have = set(value.split())
            out["flags"] = sorted(have & {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16",
                                          "amx_tile", "avx512_vnni"})
            break
    return out


def timed(fn) -> tuple[float, float]:
    """(wall, process CPU) seconds of one call."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def _best(times: dict) -> str:
    return min(times, key=lambda k: statistics.median(times[k]))


def _ratio(ref: list[float], ours: list[float]) -> float:
    return round(statistics.median([r / o for o, r in zip(ours, ref)]), 3)


def bench(name: str, repeats: int, batch: int | None, length: int | None,
          torch_threads: list[int]) -> dict:
    cfg, b, t = CONFIGS[name]
    b, t = batch or b, length or t
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (b, t))
    ours = {p: ours_step(model, tokens, *dts) for p, dts in PRECISIONS.items()}
    with tempfile.TemporaryDirectory() as d:
        save_pretrained(model, cfg, d)
        refs = {f"{p}_threads_{n}": reference_step(d, tokens, n, p)
                for p in TORCH_PRECISIONS for n in torch_threads}
    runs = {**{f"ours_{k}": v for k, v in ours.items()}, **{f"torch_{k}": v for k, v in refs.items()}}
    losses = {k: round(run(), 6) for k, run in runs.items()}  # warm-up (compile)
    times, cpu = {k: [] for k in runs}, {k: [] for k in runs}
    for _ in range(repeats):
        for k, run in runs.items():
            wall, used = timed(run)
            times[k].append(wall)
            cpu[k].append(used)
    n_tok = b * t
    ours_t = {k: times[f"ours_{k}"] for k in ours}
    ref_t = {k: times[f"torch_{k}"] for k in refs}
    ref_f32 = {k: v for k, v in ref_t.items() if k.startswith("f32")}
    ref_bf16 = {k: v for k, v in ref_t.items() if k.startswith("bf16_threads")}
    ref_f32head = {k: v for k, v in ref_t.items() if not k.startswith("bf16_threads")}
    best_ours, best_ref = _best(ours_t), _best(ref_t)
    best_f32head_ours = _best({k: ours_t[k] for k in ("f32", "mixed")})
    best_f32, best_bf16, best_f32head = _best(ref_f32), _best(ref_bf16), _best(ref_f32head)
    res = {"params": cfg.num_params(), "batch": b, "length": t,
           "tokens_per_s": {k: round(n_tok / statistics.median(v), 1) for k, v in times.items()},
           "cpu_s_per_step": {k: round(statistics.median(v), 3) for k, v in cpu.items()},
           "loss": losses,
           "ours_best": best_ours, "torch_best": best_ref,
           "ratio": _ratio(ref_t[best_ref], ours_t[best_ours]),
           "ratio_f32": _ratio(ref_f32[best_f32], ours_t["f32"]),
           "ratio_mixed": _ratio(ref_bf16[best_bf16], ours_t["mixed"]),
           "ratio_f32_head": _ratio(ref_f32head[best_f32head], ours_t[best_f32head_ours]),
           "ratio_bf16_head": _ratio(ref_bf16[best_bf16], ours_t["mixed_bf16head"]),
           "cpu_ratio": _ratio(cpu[f"torch_{best_ref}"], cpu[f"ours_{best_ours}"])}
    tps = res["tokens_per_s"]
    print(f"{name}: {res['params'] / 1e6:.2f}M params, {b}x{t} tokens; tokens/s: "
          + ", ".join(f"{k} {v:.0f}" for k, v in tps.items()), flush=True)
    print(f"{name}: ratio (ours {best_ours} vs torch {best_ref}) {res['ratio']:.2f}x, "
          f"f32 vs torch {best_f32} {res['ratio_f32']:.2f}x, mixed vs torch {best_bf16} "
          f"{res['ratio_mixed']:.2f}x, mixed_bf16head vs torch {best_bf16} "
          f"{res['ratio_bf16_head']:.2f}x, ours {best_f32head_ours} vs torch's best with an f32 head "
          f"{best_f32head} {res['ratio_f32_head']:.2f}x, by process CPU time "
          f"{res['cpu_ratio']:.2f}x; losses {losses}", flush=True)
    return res


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="tiny,50m", help="comma-separated: tiny, 50m")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=None, help="override per-config batch")
    parser.add_argument("--length", type=int, default=None, help="override per-config length")
    parser.add_argument("--torch_threads", default=None,
                        help="comma-separated torch thread counts to try (default: 1 and all cores)")
    args = parser.parse_args()
    names = [c for c in args.configs.split(",") if c]
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown configs {unknown}; known: {sorted(CONFIGS)}")
    import torch

    threads = ([int(n) for n in args.torch_threads.split(",")] if args.torch_threads
               else sorted({1, torch.get_num_threads()}))
    results = {"benchmark": "learner_step", "backend": jax.default_backend(),
               "cpu": cpu_description(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
               "jax": jax.__version__, "torch": torch.__version__,
               "torch_threads": threads, "repeats": args.repeats,
               "load_avg_start": round(os.getloadavg()[0], 2)}
    for name in names:
        results[name] = bench(name, args.repeats, args.batch, args.length, threads)
    # Other processes' load skews absolute numbers (and OpenMP suffers more from it).
    results["load_avg_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
