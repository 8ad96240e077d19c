"""Fleet ingest rate through gRPC vs the learner's consumption rate.

    .venv/bin/python benchmarks/ingest.py

Workers (in-process, 127.0.0.1) answer every lease at once with a ready
trajectory of ``--length`` tokens, so the measured rate is the transport
path alone: worker codec + gRPC stream + dispatcher decode/validate/buffer +
``get_batch``. The learner's consumption rate is measured in the same run: the project
learner's SAO update (``sao.learner``: critic values, 2 critic steps, DIS
actor step) on the ``tiny`` preset with ``[--learner_batch, --length]`` batches. The ratio compares tokens/s.
Ends with one JSON line. Target: ingest >= 20x the learner's consumption.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
from sao.fleet.local import ThreadedWorker
from sao.fleet.worker import WorkerConfig
from sao.rollout.base import Engine
from sao.rpc import codec
from sao.types import Trajectory


class _Idle(Engine):
    version = 0

    async def generate(self, prompt_tokens, params):
        raise NotImplementedError("the ingest benchmark never samples")

    async def load_weights(self, version, uri):
        self.version = version

    async def health(self):
        return True


def ready_trajectory(length: int, seed: int = 0) -> Trajectory:
    rng = np.random.default_rng(seed)
    n_prompt = length // 8
    mask = np.arange(length) >= n_prompt
    return Trajectory(tokens=rng.integers(0, 256, length), action_mask=mask,
                      rollout_logprobs=np.where(mask, -rng.exponential(size=length), 0.0),
                      policy_version=np.zeros(length), reward=1.0, finish="stop",
                      prompt_id="", trajectory_id="")


def measure_ingest(args) -> dict:
    template = ready_trajectory(args.length)

    def make():
        async def episode(prompt):
            return Trajectory(template.tokens, template.action_mask, template.rollout_logprobs,
                              template.policy_version, 1.0, "stop", "", "")
        return _Idle(), episode

    workers = [ThreadedWorker(make, WorkerConfig(max_concurrency=args.concurrency))
               for _ in range(args.workers)]
    n = args.trajectories
    prompts = ({"prompt_id": f"p{i}"} for i in range(n + args.warmup))
    cfg = DispatcherConfig(batch_size=args.batch_size, vocab_size=272, tau=1_000_000,
                           max_in_flight=args.workers * args.concurrency)
    try:
        with Dispatcher([w.address for w in workers], prompts, cfg) as d:
            got = 0
            while got < args.warmup:
                got += len(d.get_batch(timeout=120))
            t0, got = time.perf_counter(), 0
            while got < n:
                got += len(d.get_batch(timeout=120))
            wall = time.perf_counter() - t0
            m = d.snapshot()
    finally:
        for w in workers:
            w.stop()
    mb = got * len(codec.encode(template)) / 1e6
    return {"trajectories_per_s": got / wall, "mb_per_s": mb / wall,
            "tokens_per_s": got * args.length / wall, "drops": m["drops"]}


def measure_learner(args) -> dict:
    """Tokens/s of the project learner's SAO update (critic values, K=2 critic
    steps, DIS actor step) on the ``tiny`` preset, one device."""
    import jax
    from flax import nnx

    from sao.learner import LearnerConfig, make_train_batch
    from sao.learner.learner import Learner
    from sao.learner.mesh import mesh_from_config
    from sao.models import Transformer, get_preset

    cfg = LearnerConfig(batch_size=args.learner_batch, length_buckets=(args.length,),
                        critic_warmup_steps=0, shard_check="off")
    mesh = mesh_from_config({"data": 1}, devices=jax.devices()[:1])
    learner = Learner(cfg, mesh, lambda: Transformer(get_preset("tiny"), rngs=nnx.Rngs(0)))
    states = learner.init_states()
    t = ready_trajectory(args.length)
    batch = make_train_batch([t] * args.learner_batch, buckets=cfg.length_buckets,
                             batch_size=cfg.batch_size, pad_id=cfg.pad_id)
    states, _ = learner.update(states, batch)  # compile
    jax.block_until_ready(states)
    t0 = time.perf_counter()
    for _ in range(args.learner_steps):
        states, _ = learner.update(states, batch)
    jax.block_until_ready(states)
    wall = time.perf_counter() - t0
    return {"tokens_per_s": args.learner_steps * args.learner_batch * args.length / wall,
            "trajectories_per_s": args.learner_steps * args.learner_batch / wall}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=1024, help="tokens per trajectory")
    p.add_argument("--trajectories", type=int, default=3000)
    p.add_argument("--warmup", type=int, default=256)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--learner_batch", type=int, default=4)
    p.add_argument("--learner_steps", type=int, default=2)
    args = p.parse_args()

    ingest = measure_ingest(args)
    learner = measure_learner(args)
    ratio = ingest["tokens_per_s"] / learner["tokens_per_s"]
    print(f"ingest: {ingest['trajectories_per_s']:.0f} traj/s, {ingest['mb_per_s']:.1f} MB/s, "
          f"{ingest['tokens_per_s'] / 1e6:.2f}M tokens/s (drops {ingest['drops']})")
    print(f"learner (tiny preset, SAO update): {learner['tokens_per_s']:.0f} tokens/s, "
          f"{learner['trajectories_per_s']:.2f} traj/s")
    print(f"ingest / learner consumption: {ratio:.0f}x")
    print(json.dumps({
        "benchmark": "ingest", "length": args.length, "trajectories": args.trajectories,
        "workers": args.workers,
        "ingest_trajectories_per_s": round(ingest["trajectories_per_s"], 1),
        "ingest_mb_per_s": round(ingest["mb_per_s"], 2),
        "ingest_tokens_per_s": round(ingest["tokens_per_s"]),
        "learner_tokens_per_s": round(learner["tokens_per_s"]),
        "ratio": round(ratio, 1)}))


if __name__ == "__main__":
    main()
