"""Benchmark: cost of one SAO learner update relative to one actor step.

    .venv/bin/python benchmarks/learner_update.py
    .venv/bin/python benchmarks/learner_update.py --preset tiny --batch 8 --length 256 --repeats 5

In one run, on the same weights and batch (one device):

* reference ``actor_step``: ``Learner.update`` of a critic-free config with
  given per-row advantages (``advantage_estimator="given"``): one DIS
  forward+backward and AdamW update of the policy, plus broadcasting the
  advantages onto the action tokens;
* ``update``: ``Learner.update`` of the SAO config: critic values,
  skip-observation GAE, K=2 critic steps (frozen attention) and the actor
  step, i.e. what the paper's method costs per batch; expected ratio about
  1 + K (the critic forward is cheap, frozen attention saves its weight
  gradients);
* ``update`` with ``micro_batch_size = batch / 4`` (gradient accumulation
  over 4 micro-batches) against the whole-batch ``update``.

Times are medians over ``--repeats`` alternating rounds after one compile
step each; the last line is one JSON object.
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
from flax import nnx

from sao.learner import LearnerConfig, make_train_batch
from sao.learner.learner import Learner
from sao.learner.mesh import mesh_from_config
from sao.models import Transformer, get_preset
from sao.types import Trajectory


def trajectories(n: int, length: int, seed: int = 0) -> list[Trajectory]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        mask = np.zeros(length, bool)
        mask[length // 8:] = True
        mask[length // 2: length // 2 + length // 16] = False  # one observation span
        out.append(Trajectory(tokens=rng.integers(0, 256, length), action_mask=mask,
                              rollout_logprobs=np.where(mask, -5.6, 0.0),
                              policy_version=np.zeros(length), reward=float(i % 2),
                              finish="stop", prompt_id=f"p{i}", trajectory_id=f"t{i}"))
    return out


def timed(fn) -> float:
    t = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    mesh = mesh_from_config({"data": 1}, devices=jax.devices()[:1])
    policy = lambda: Transformer(get_preset(args.preset), rngs=nnx.Rngs(0))  # noqa: E731
    base = LearnerConfig(batch_size=args.batch, length_buckets=(args.length,),
                         critic_warmup_steps=0, shard_check="off")
    whole = Learner(base, mesh, policy)
    actor_only = Learner(base.replace(advantage_estimator="given", critic_steps=0), mesh, policy)
    micro = Learner(base.replace(micro_batch_size=max(1, args.batch // 4)), mesh, policy)
    batch = make_train_batch(trajectories(args.batch, args.length), buckets=(args.length,),
                             batch_size=args.batch, pad_id=base.pad_id)

    holders = {}
    given = np.full(args.batch, 0.1, np.float32)  # per-row advantages of the reference

    def update(name, learner, *extra):
        def run():
            holders[name], m = learner.update(holders[name], batch, *extra)
            return jnp.float32(m["actor/loss"])
        return run

    fns = {"actor_step": update("actor", actor_only, given), "update": update("sao", whole),
           "update_micro4": update("micro", micro)}
    holders.update(actor=actor_only.init_states(), sao=whole.init_states(),
                   micro=micro.init_states())
    compile_s = {k: timed(f) for k, f in fns.items()}
    times = {k: [] for k in fns}
    for _ in range(args.repeats):
        for k, f in fns.items():
            times[k].append(timed(f))
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = args.batch * args.length
    result = {
        "preset": args.preset, "batch": args.batch, "length": args.length,
        "repeats": args.repeats, "load_average_1m": os.getloadavg()[0],
        "median_s": med, "compile_s": compile_s,
        "tokens_per_s": {k: tokens / v for k, v in med.items()},
        "ratio_update_vs_actor_step": med["update"] / med["actor_step"],
        "ratio_micro4_vs_whole": med["update_micro4"] / med["update"],
    }
    for k in fns:
        print(f"{k:>18}: {med[k] * 1e3:8.1f} ms  ({tokens / med[k]:8.0f} tok/s, "
              f"compile {compile_s[k]:.1f} s)")
    print(f"update / actor_step = {result['ratio_update_vs_actor_step']:.2f}; "
          f"micro x4 / whole = {result['ratio_micro4_vs_whole']:.2f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
