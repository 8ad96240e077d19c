"""Where a learner step's time goes: decoder, LM head + log-softmax, optimizer update.

    .venv/bin/python benchmarks/learner_breakdown.py                 # 50m, every precision
    .venv/bin/python benchmarks/learner_breakdown.py --config tiny --repeats 9

On `learner_step.py`'s models and tokens, each part jitted and timed on its own
(median of ``--repeats`` interleaved rounds after one compile), for each of our
precisions (`learner_step.PRECISIONS`):

* ``full``: forward+backward of the next-token loss through `token_logprobs`
  (what `learner_step.py` times);
* ``decoder``: forward+backward of the decoder alone (``hidden_states``, loss =
  mean of the last hidden states: every decoder product, no head);
* ``head``: forward+backward of the chunked LM head and log-softmax on fixed
  hidden states (gradients for the hidden states and the head kernel);
* ``adamw``: one ``optax.adamw`` update applied to float32 parameters (the
  learner's optimizer; not part of ``full``).

``decoder + head`` exceeds ``full`` by what the two share (the embedding
lookup, the final norm). Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from learner_step import CONFIGS, PRECISIONS, cpu_description
from sao.models import Transformer, token_logprobs
from sao.models.logprobs import _chunked_logprobs


def parts(model, tokens, dtype: str, head_dtype: str) -> dict:
    """Name -> callable running that part once (blocking)."""
    cfg = model.cfg.replace(dtype=dtype, head_dtype=head_dtype)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    params = nnx.state(model)
    x = jnp.asarray(tokens, jnp.int32)

    def full(p):
        return -jnp.mean(token_logprobs(nnx.merge(graphdef, p), x)[:, 1:])

    def decoder(p):
        return jnp.mean(nnx.merge(graphdef, p).hidden_states(x).astype(jnp.float32))

    m = nnx.merge(graphdef, params)
    hidden = jax.jit(lambda p: nnx.merge(graphdef, p).hidden_states(x))(params)[:, :-1]
    kernel = m.head_kernel()

    def head(h, w):
        lp, _ = _chunked_logprobs(h, x[:, 1:], w, 1.0, 128, head_dtype)
        return -jnp.mean(lp)

    grads = jax.jit(jax.grad(full))(params)
    tx = optax.adamw(1e-5)
    opt = tx.init(params)

    def adamw(p, g, o):
        updates, o = tx.update(g, o, p)
        return optax.apply_updates(p, updates), o

    steps = {"full": (jax.jit(jax.value_and_grad(full)), (params,)),
             "decoder": (jax.jit(jax.value_and_grad(decoder)), (params,)),
             "head": (jax.jit(jax.value_and_grad(head, argnums=(0, 1))), (hidden, kernel)),
             "adamw": (jax.jit(adamw), (params, grads, opt))}
    return {k: (lambda f=f, a=a: jax.block_until_ready(f(*a))) for k, (f, a) in steps.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="50m", choices=sorted(CONFIGS))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    mcfg, b, t = CONFIGS[args.config]
    model = Transformer(mcfg, rngs=nnx.Rngs(0))
    tokens = np.random.default_rng(0).integers(0, mcfg.vocab_size, (b, t))
    runs = {f"{p}/{k}": fn for p, dts in PRECISIONS.items()
            for k, fn in parts(model, tokens, *dts).items()}
    for fn in runs.values():
        fn()                                               # compile
    times = {k: [] for k in runs}
    for _ in range(args.repeats):
        for k, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    ms = {k: round(1e3 * statistics.median(v), 1) for k, v in times.items()}
    share = {p: {k: round(ms[f"{p}/{k}"] / ms[f"{p}/full"], 3) for k in ("decoder", "head", "adamw")}
             for p in PRECISIONS}
    print(json.dumps({"benchmark": "learner_breakdown", "config": args.config, "batch": b,
                      "length": t, "cpu": cpu_description(), "repeats": args.repeats,
                      "load_avg": round(os.getloadavg()[0], 2), "median_ms": ms,
                      "fraction_of_full": share}))


if __name__ == "__main__":
    main()
