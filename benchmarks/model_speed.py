"""Benchmark: the model family's hot paths, each against a reference in the same run.

    .venv/bin/python benchmarks/model_speed.py                   # tiny, 16 x 128
    .venv/bin/python benchmarks/model_speed.py --preset tiny --batch 32 --length 256

* train step: value-and-grad of the token log-prob loss + SGD, chunked f32
  head (``token_logprobs``) vs the same loss through materialised
  ``[B, T, V]`` logits (reference); seconds per step and tokens/s.
* log-probs forward: chunked vs materialised logits.
* generation: ``generate`` (KV cache, while_loop) vs a no-cache reference that
  reruns the full forward for every new token (same sampling); tokens/s.

Prints a table; the last line is one JSON object with every figure. Times are
medians of ``--repeats`` runs after a compile/warm-up call; on a shared CPU
compare ratios, not absolute times.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sao.models import Transformer, generate, get_preset, sample_tokens, token_logprobs


def timed(fn, repeats):
    jax.block_until_ready(fn())  # compile + warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def full_logits_logprobs(model, tokens):
    logp = jax.nn.log_softmax(model(tokens), axis=-1)[:, :-1]
    lp = jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
    return jnp.pad(lp, ((0, 0), (1, 0)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    cfg = get_preset(args.preset)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    tokens = jax.random.randint(jax.random.key(1), (args.batch, args.length), 0, cfg.vocab_size)
    tx = optax.sgd(1e-3)
    opt_state = tx.init(state)
    out = {"benchmark": "model_speed", "preset": args.preset, "params": cfg.num_params(), "batch": args.batch,
           "length": args.length}

    def make_step(lp_fn):
        @jax.jit
        def step(state, opt_state):
            loss, grads = jax.value_and_grad(
                lambda st: -lp_fn(nnx.merge(graphdef, st), tokens).mean())(state)
            updates, opt_state = tx.update(grads, opt_state, state)
            return optax.apply_updates(state, updates), opt_state, loss
        return step

    chunked = lambda m, t: token_logprobs(m, t, chunk=args.chunk)  # noqa: E731
    for name, fn in (("chunked", chunked), ("full_logits", full_logits_logprobs)):
        step = make_step(fn)
        out[f"train_step_s_{name}"] = timed(lambda: step(state, opt_state), args.repeats)
        fwd = jax.jit(lambda st: fn(nnx.merge(graphdef, st), tokens))
        out[f"logprobs_s_{name}"] = timed(lambda: fwd(state), args.repeats)
    n_tok = args.batch * args.length
    out["train_tokens_per_s"] = n_tok / out["train_step_s_chunked"]
    out["train_ratio_full_over_chunked"] = out["train_step_s_full_logits"] / out["train_step_s_chunked"]
    out["logprobs_ratio_full_over_chunked"] = out["logprobs_s_full_logits"] / out["logprobs_s_chunked"]

    prompt_len = 16
    prompts = tokens[:, :prompt_len]
    lengths = jnp.full((args.batch,), prompt_len, jnp.int32)
    n_new = args.new_tokens
    gen_s = timed(lambda: generate(model, prompts, lengths, rng=jax.random.key(0),
                                   max_new_tokens=n_new).tokens, args.repeats)

    @jax.jit
    def no_cache(state, rng):
        m = nnx.merge(graphdef, state)
        buf = jnp.zeros((args.batch, prompt_len + n_new), jnp.int32).at[:, :prompt_len].set(prompts)

        def body(i, carry):
            buf, rng = carry
            rng, sub = jax.random.split(rng)
            logits = m(buf)[:, prompt_len + i - 1]
            tok, _ = sample_tokens(sub, logits, truncate=False)
            return buf.at[:, prompt_len + i].set(tok), rng
        return jax.lax.fori_loop(0, n_new, body, (buf, rng))[0]

    ref_s = timed(lambda: no_cache(state, jax.random.key(0)), args.repeats)
    out["generate_tokens_per_s"] = args.batch * n_new / gen_s
    out["generate_no_cache_tokens_per_s"] = args.batch * n_new / ref_s
    out["generate_speedup_vs_no_cache"] = ref_s / gen_s

    for k, v in out.items():
        print(f"{k:38s} {v:.4g}" if isinstance(v, float) else f"{k:38s} {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
