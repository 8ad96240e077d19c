"""Benchmark: learner forward+backward tokens/s, SAO (JAX) vs transformers (PyTorch).

    .venv/bin/python benchmarks/learner_step.py
    .venv/bin/python benchmarks/learner_step.py --configs tiny --repeats 5

For each config (``tiny``: the preset, ~0.5M parameters, byte vocabulary;
``50m``: a Qwen3 of ~48M parameters, d=512, 10 layers, vocab 32768, tied
embeddings), in one run and on the same random weights and tokens:

* ours: ``jax.jit(jax.value_and_grad(loss))`` where ``loss`` is next-token
  cross-entropy from `sao.models.token_logprobs` (the learner's path:
  float32 head and log-softmax, chunked over time), gradients w.r.t. every
  parameter;
* reference: the same weights exported with `sao.models.save_pretrained`,
  loaded by ``transformers`` (float32, default attention), ``loss =
  cross_entropy(logits[:, :-1], tokens[:, 1:])`` then ``loss.backward()``,
  with 1 and with all intra-op threads (``--torch_threads``); the ratio is
  against the faster of the two.

Both losses are printed (they must agree: same weights, same loss). After
one warm-up (compile) step each, ``--repeats`` rounds alternate ours /
reference(s); tokens/s are from median step times and ``ratio`` is the median
over pairs of ``transformers step time / our step time`` (> 1: ours faster). The last line is one JSON
object with every figure.
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


def ours_step(model, tokens: np.ndarray):
    """A callable running one jitted forward+backward; returns the loss."""
    graphdef, params = nnx.split(model)

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


def reference_step(path: str, tokens: np.ndarray, threads: int):
    """transformers model from ``path``: one forward+backward on ``threads``
    intra-op threads; returns the loss."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    x = torch.tensor(tokens, dtype=torch.long)

    def run() -> float:
        torch.set_num_threads(threads)
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1))
        loss.backward()
        for p in model.parameters():
            p.grad = None
        return float(loss.detach())

    return run


def timed(fn) -> tuple[float, float]:
    t0 = time.perf_counter()
    loss = fn()
    return time.perf_counter() - t0, loss


def bench(name: str, repeats: int, batch: int | None, length: int | None,
          torch_threads: list[int]) -> dict:
    cfg, b, t = CONFIGS[name]
    b, t = batch or b, length or t
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (b, t))
    run_ours = ours_step(model, tokens)
    with tempfile.TemporaryDirectory() as d:
        save_pretrained(model, cfg, d)
        refs = {n: reference_step(d, tokens, n) for n in torch_threads}
    ours_loss = run_ours()  # warm-up (compile)
    ref_loss = {n: run() for n, run in refs.items()}
    # Interleaved so that load from other processes hits every variant alike.
    ours_s, ref_s = [], {n: [] for n in refs}
    for _ in range(repeats):
        ours_s.append(timed(run_ours)[0])
        for n, run in refs.items():
            ref_s[n].append(timed(run)[0])
    # The reference is credited with its best thread setting (OpenMP suffers
    # badly when the machine is oversubscribed).
    best = min(refs, key=lambda n: statistics.median(ref_s[n]))
    n_tok = b * t
    res = {"params": cfg.num_params(), "batch": b, "length": t,
           "ours_tokens_per_s": round(n_tok / statistics.median(ours_s), 1),
           "transformers_tokens_per_s": {
               f"threads_{n}": round(n_tok / statistics.median(v), 1) for n, v in ref_s.items()},
           "transformers_best_threads": best,
           "ratio": round(statistics.median([r / o for o, r in zip(ours_s, ref_s[best])]), 3),
           "ours_loss": round(ours_loss, 6), "transformers_loss": round(ref_loss[best], 6)}
    ref_txt = ", ".join(f"{v:.0f} ({k.split('_')[1]} thr)"
                        for k, v in res["transformers_tokens_per_s"].items())
    print(f"{name}: {res['params'] / 1e6:.2f}M params, {b}x{t} tokens: ours "
          f"{res['ours_tokens_per_s']:.0f} tok/s, transformers {ref_txt} tok/s, "
          f"ratio vs best {res['ratio']:.2f}x; loss {ours_loss:.6f} vs {ref_loss[best]:.6f}",
          flush=True)
    return res


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="tiny,50m", help="comma-separated: tiny, 50m")
    parser.add_argument("--repeats", type=int, default=3)
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
               "torch_threads": threads, "repeats": args.repeats,
               "load_avg_start": round(os.getloadavg()[0], 2)}
    for name in names:
        results[name] = bench(name, args.repeats, args.batch, args.length, threads)
    # Other processes' load skews absolute numbers (and OpenMP suffers more from it).
    results["load_avg_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
