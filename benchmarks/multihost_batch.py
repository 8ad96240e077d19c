"""A multi-process learner on this CPU: how batches reach every process, and the step cost.

    .venv/bin/python benchmarks/multihost_batch.py

Starts a 2-process x 4-device job and a 1-process x 8-device job (both through
``jax.distributed`` with gloo CPU collectives, like the multi-host learner and
its reference in tests/multihost). In each, process 0 holds B trajectories of
up to T tokens, and every process needs the placed ``TrainBatch`` (rows
sharded over the 8 devices). Two ways, timed per batch (median of repeats):

* ``trajectories``: the lead's trajectories are sent encoded
  (``sao.multihost.broadcast_trajectories``: a key-value barrier, then
  ``broadcast_one_to_all`` of the bytes); every process pads the same host
  batch (``make_train_batch``) and places its own rows
  (``jax.make_array_from_callback`` in ``put_batch``), what ``sao.train`` does;
* ``arrays``: the lead pads the batch, its arrays are broadcast
  (``broadcast_one_to_all``, after the same barrier), every process places its rows.

The reference is the learner's own update (``Learner.update``, tiny preset,
SAO with a critic) on that batch, in the same job; and the same update in the
1-process job (median of 2 after the compiling one). Ends with one JSON line.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, T, REPEATS, UPDATE_REPEATS = 16, 512, 5, 2


def child(nproc: int, pid: int, port: int) -> None:
    os.environ["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={8 // nproc} "
                               "--xla_cpu_collective_timeout_seconds=3600")
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path.insert(0, ROOT)
    import jax
    import numpy as np
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc,
                               process_id=pid)
    from jax.experimental import multihost_utils
    from flax import nnx

    from sao import multihost
    from sao.learner.batch import TrainBatch, make_train_batch
    from sao.learner.config import LearnerConfig
    from sao.learner.learner import Learner
    from sao.learner.mesh import mesh_from_config, put_batch
    from sao.models import Transformer, get_preset
    from sao.types import Trajectory

    mesh = mesh_from_config({"data": -1})
    lead = multihost.is_lead()
    rng = np.random.default_rng(0)
    trajs = []
    for i in range(B):
        n = int(rng.integers(T // 4, T))
        mask = np.zeros(n, bool)
        mask[64:] = True
        trajs.append(Trajectory(tokens=rng.integers(0, 256, n).astype(np.int32), action_mask=mask,
                                rollout_logprobs=np.where(mask, -5.0, 0.0).astype(np.float32),
                                policy_version=np.zeros(n, np.int32), reward=float(i % 2),
                                finish="stop", prompt_id=f"p{i}", trajectory_id=f"t{i}"))

    def by_trajectories():
        got = multihost.broadcast_trajectories(trajs if lead else None)
        batch = make_train_batch(got, buckets=(T,), batch_size=B, pad_id=256)
        return put_batch(batch, mesh, B)

    template = make_train_batch(trajs, buckets=(T,), batch_size=B, pad_id=256)
    fields = [f.name for f in dataclasses.fields(template)]

    def by_arrays():
        if lead:
            batch = make_train_batch(trajs, buckets=(T,), batch_size=B, pad_id=256)
        else:          # the shapes only: broadcast_one_to_all takes the lead's values
            batch = jax.tree.map(np.zeros_like, template)
        if multihost.process_count() > 1:
            multihost.sync("arrays")
            arrays = multihost_utils.broadcast_one_to_all({k: getattr(batch, k) for k in fields})
            batch = TrainBatch(**{k: np.asarray(v) for k, v in arrays.items()})
        return put_batch(batch, mesh, B)

    def timed(fn):
        out = []
        for _ in range(REPEATS + 1):
            t = time.perf_counter()
            jax.block_until_ready(fn())
            out.append(time.perf_counter() - t)
        return statistics.median(out[1:])          # the first compiles

    place = {"trajectories_s": timed(by_trajectories), "arrays_s": timed(by_arrays)}
    cfg = LearnerConfig(batch_size=B, length_buckets=(T,), critic_warmup_steps=0,
                        deterministic=True, shard_check="off")
    learner = Learner(cfg, mesh, lambda: Transformer(get_preset("tiny"), rngs=nnx.Rngs(0)))
    states = learner.init_states()
    batch = by_trajectories()
    steps = []
    for _ in range(UPDATE_REPEATS + 1):
        t = time.perf_counter()
        states, _ = learner.update(states, batch)
        steps.append(time.perf_counter() - t)
    if lead:
        print(json.dumps({"processes": nproc, **place, "update_s": statistics.median(steps[1:])}),
              flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(nproc: int) -> dict:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    errs = [tempfile.TemporaryFile("w+") for _ in range(nproc)]
    procs = [subprocess.Popen([sys.executable, __file__, "--child", str(nproc), str(i), str(port)],
                              stdout=subprocess.PIPE, stderr=errs[i], text=True, env=env)
             for i in range(nproc)]
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    if any(p.returncode for p in procs):
        tails = []
        for e in errs:
            e.seek(0)
            tails.append(e.read()[-2000:])
        raise RuntimeError(f"{nproc}-process job failed: {tails}")
    return json.loads(outs[0].strip().splitlines()[-1])


def main() -> None:
    two, one = job(2), job(1)
    print(json.dumps({
        "benchmark": "multihost_batch", "batch": B, "max_len": T, "devices": 8,
        "two_process": two, "one_process": one,
        "trajectories_over_arrays_2p": round(two["trajectories_s"] / two["arrays_s"], 3),
        "placement_over_update_2p": round(two["trajectories_s"] / two["update_s"], 4),
        "update_2p_over_1p": round(two["update_s"] / one["update_s"], 3)}))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
