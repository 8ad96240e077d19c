"""Scripted workers for the hostile-worker tests: real rollout workers
(``sao.fleet.worker`` over gRPC, the simulated engine) whose episodes do what
each prompt asks: ``metadata`` replaces the trajectory's metadata,
``logprob`` the rollout log-prob of its last action token, ``hang`` never
finishes. A ``StealingServicer`` also answers leases it never got, from
``STOLEN`` (ids another worker's ``RecordingServicer`` saw), with forged rows."""
from __future__ import annotations

import asyncio

from sao.fleet import sim
from sao.fleet.local import ThreadedWorker
from sao.fleet.worker import RolloutServicer, WorkerConfig
from sao.rpc import codec, sao_pb2
from sao.types import Trajectory

VOCAB = 272
FORGED_REWARD = 77.0
STOLEN: list[str] = []  # lease ids a RecordingServicer received


def scripted_episode_fn(engine):
    base = sim.make_sim_episode_fn(engine)

    async def episode(prompt: dict, temperature: float | None = None) -> Trajectory:
        if prompt.get("hang"):
            await asyncio.Event().wait()  # takes the lease, never answers
        traj = await base(prompt)
        if "metadata" in prompt:
            traj.metadata = prompt["metadata"]
        if "logprob" in prompt:
            traj.rollout_logprobs[-1] = prompt["logprob"]
        return traj

    return episode


async def _until(condition, timeout_s: float = 60.0) -> None:
    """Waits (polling) until ``condition()`` holds, at most ``timeout_s``: a bound, not a
    race, since each side below waits only for what the other does next."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition() and loop.time() < deadline:
        await asyncio.sleep(0.01)


class RecordingServicer(RolloutServicer):
    """An honest worker whose lease ids leak (``STOLEN``). Its episodes answer only once
    the thief has forged at least one answer, so the forgery does not depend on which
    worker runs faster (under load the thief used to finish its own leases before any id
    leaked, and forged nothing)."""

    async def _episode(self, lease):
        STOLEN.append(lease.lease_id)
        await _until(lambda: StealingServicer.forged)
        return await super()._episode(lease)


class StealingServicer(RolloutServicer):
    """Answers its own leases, and with each response forges answers to every
    lease id in ``STOLEN`` (reward ``FORGED_REWARD``)."""

    forged: set[str] = set()

    async def _episode(self, lease):
        await _until(lambda: STOLEN)  # its first response comes after an id leaked
        return await super()._episode(lease)

    async def Generate(self, request_iterator, context):
        async for response in super().Generate(request_iterator, context):
            for lease_id in [i for i in STOLEN if i not in self.forged]:
                self.forged.add(lease_id)
                traj = Trajectory(tokens=[1, 2, 3, 4], action_mask=[False, True, True, True],
                                  rollout_logprobs=[0, -1, -1, -1], policy_version=[0] * 4,
                                  reward=FORGED_REWARD, finish="stop", prompt_id="",
                                  trajectory_id=lease_id)
                response.finished.append(sao_pb2.Finished(lease_id=lease_id,
                                                          trajectory=codec.encode(traj)))
            yield response


def scripted_worker(seconds_per_token: float = 1e-4, servicer_cls=RolloutServicer,
                    **config) -> ThreadedWorker:
    def make():
        engine = sim.SimulatedEngine(seconds_per_token=seconds_per_token)
        return engine, scripted_episode_fn(engine)
    config.setdefault("max_concurrency", 16)
    return ThreadedWorker(make, WorkerConfig(**config), servicer_cls=servicer_cls)
