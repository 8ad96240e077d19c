"""A hostile or hung rollout worker process for a real ``python -m sao.main`` run.

    python tests/reliability/hostile_fleet_worker.py --mode=mixed --token_file=W/fleet.token \\
        --publish_root=W/publish --lease_file=W/leases.txt

Serves ``RolloutWorker`` (``sao.fleet.worker``, the run's token) with the
simulated engine producing byte-token trajectories (ids < 256). ``--mode``:

* ``mixed``: answers its own leases, most with good rows and in turn with
  rows a learner must drop: metadata of the wrong type (S1: ``num_tool_calls:
  null``, ``phase`` alone, ``tool_timeouts: "x"``) and a rollout log-prob of
  -1e30 (S5); with each response it also forges answers to the lease ids in
  ``--lease_file`` (S4: another worker's leases).
* ``hang``: takes leases and never answers them (S6), staying connected; it
  writes each lease id it gets to ``--lease_file`` (as if they leaked).

Prints ``READY <host:port>`` once it listens; SIGTERM stops it.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import os
import sys

from sao.fleet import sim
from sao.fleet.worker import RolloutServicer, WorkerConfig, run
from sao.rollout.base import SamplingParams
from sao.rpc import codec, credentials, sao_pb2
from sao.types import Trajectory

# What the mixed worker sends, in turn: None = a good row.
PLAN = [None, None, {"metadata": {"num_tool_calls": None}}, None, {"logprob": -1e30}, None,
        {"metadata": {"phase": 1}}, None, {"metadata": {"tool_timeouts": "x"}}]


def episode_fn(engine, mode: str):
    turn = itertools.count()

    async def episode(prompt: dict, temperature: float | None = None) -> Trajectory:
        if mode == "hang":
            await asyncio.Event().wait()
        digest = hashlib.blake2b(str(prompt.get("prompt_id")).encode(), digest_size=8).digest()
        ptoks = [32 + b % 90 for b in digest]
        c = await engine.generate(ptoks, SamplingParams(max_new_tokens=16))
        n_p = len(ptoks)
        traj = Trajectory(tokens=ptoks + [t % 256 for t in c.tokens],
                          action_mask=[False] * n_p + [True] * len(c.tokens),
                          rollout_logprobs=[0.0] * n_p + c.logprobs,
                          policy_version=[c.versions[0]] * n_p + c.versions,
                          reward=float(digest[0] % 2), finish="stop",
                          prompt_id=str(prompt.get("prompt_id")), trajectory_id="",
                          metadata={"num_tool_calls": 0, "tool_timeouts": 0})
        fault = PLAN[next(turn) % len(PLAN)] or {}
        if "metadata" in fault:
            traj.metadata = fault["metadata"]
        if "logprob" in fault:
            traj.rollout_logprobs[-1] = fault["logprob"]
        return traj

    return episode


def servicer_class(mode: str, lease_file: str):
    class Hostile(RolloutServicer):
        forged: set[str] = set()

        async def _episode(self, lease):
            if mode == "hang":
                with open(lease_file, "a") as f:
                    f.write(lease.lease_id + "\n")
            return await super()._episode(lease)

        async def Generate(self, request_iterator, context):
            async for response in super().Generate(request_iterator, context):
                if mode == "mixed" and os.path.exists(lease_file):
                    with open(lease_file) as f:
                        stolen = [i for i in f.read().split() if i not in self.forged]
                    for lease_id in stolen:
                        self.forged.add(lease_id)
                        forged = Trajectory(tokens=[65, 66, 67, 68], action_mask=[0, 1, 1, 1],
                                            rollout_logprobs=[0, -5, -5, -5],
                                            policy_version=[self.engine.version] * 4,
                                            reward=1.0, finish="stop", prompt_id="",
                                            trajectory_id=lease_id)
                        response.finished.append(sao_pb2.Finished(
                            lease_id=lease_id, trajectory=codec.encode(forged)))
                yield response

    return Hostile


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["mixed", "hang"], required=True)
    p.add_argument("--token_file", required=True)
    p.add_argument("--publish_root", required=True)
    p.add_argument("--lease_file", required=True)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    security = credentials.load_security(token_file=args.token_file)

    def make():
        engine = sim.SimulatedEngine(seconds_per_token=1e-3, vocab_size=256,
                                     logprob_range=(-5.7, -5.3), version=-1)
        return engine, episode_fn(engine, args.mode)

    config = WorkerConfig(port=args.port, max_concurrency=8, security=security,
                          publish_root=args.publish_root)
    run(make, config, ready=lambda address: print(f"READY {address}", flush=True),
        servicer_cls=servicer_class(args.mode, args.lease_file))

if __name__ == "__main__":
    main(sys.argv[1:])
