"""Simulated rollout workers for ``fleet_scale.py``, served from subprocesses.

    python benchmarks/fleet_hosts.py --workers 16     # prints READY <addr> ...; stdin "cpu"

Each host process serves ``--workers`` real gRPC workers (``sao.fleet.worker.serve``,
token from ``$SAO_FLEET_TOKEN``, 127.0.0.1) on one asyncio loop. An episode sleeps
``length x --seconds_per_token`` (the simulated generation) and returns a valid
trajectory of ``prompt["length"]`` tokens: the first eighth prompt, the rest
actions with log-probs <= 0, every token stamped with the weights version the
episode started under. Slices of one random pool keep the host's own CPU low,
so on a small machine it leaves CPU to the dispatcher under test. On stdin,
``cpu`` answers ``CPU <process seconds>``; end of input stops the host.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import numpy as np

from sao.fleet.worker import WorkerConfig, serve
from sao.rollout.base import Engine
from sao.rpc import auth
from sao.types import Trajectory

VOCAB = 151_936  # Qwen-sized: token ids spread over the range a real run sends


class VersionEngine(Engine):
    """Holds a weights version; the episodes here never call ``generate``."""

    def __init__(self):
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_tokens, params):
        raise NotImplementedError("episodes here build their trajectory directly")

    async def load_weights(self, version, uri):
        self._version = int(version)

    async def health(self):
        return True


def episode_fn(engine: Engine, seconds_per_token: float, seed: int):
    """``async (prompt) -> Trajectory`` for prompts ``{"length", "reward"[, "truncated"]}``."""
    rng = np.random.default_rng(seed)
    longest = 1 << 16
    tokens = rng.integers(0, VOCAB, longest).astype(np.int32)
    logprobs = -rng.exponential(1.0, longest).astype(np.float32)

    async def episode(prompt: dict) -> Trajectory:
        n, version = int(prompt["length"]), engine.version
        await asyncio.sleep(n * seconds_per_token)
        mask = np.arange(n) >= max(1, n // 8)
        return Trajectory(tokens[:n], mask, np.where(mask, logprobs[:n], 0.0),
                          np.full(n, version, np.int32), float(prompt["reward"]),
                          "length" if prompt.get("truncated") else "stop", "", "")

    return episode


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=128, help="episodes per worker")
    p.add_argument("--seconds_per_token", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    security = auth.Security(token=os.environ["SAO_FLEET_TOKEN"])

    async def serve_all():
        servers = []
        for i in range(args.workers):
            engine = VersionEngine()
            servers.append(await serve(
                engine, episode_fn(engine, args.seconds_per_token, args.seed + i),
                WorkerConfig(max_concurrency=args.concurrency, security=security)))
        print("READY " + " ".join(s.address for s in servers), flush=True)
        loop = asyncio.get_running_loop()
        while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "cpu":
            print(f"CPU {time.process_time()}", flush=True)
        for s in servers:
            await s.stop(0)

    asyncio.run(serve_all())


class Hosts:
    """``hosts`` host processes serving ``workers`` workers in all; ``addresses``
    alternate between hosts, so the first N of them span every host."""

    def __init__(self, workers: int, hosts: int, token: str, *, concurrency: int,
                 seconds_per_token: float, seed: int):
        env = dict(os.environ, SAO_FLEET_TOKEN=token)
        sizes = [k for k in (workers // hosts + (i < workers % hosts) for i in range(hosts)) if k]
        self.procs = [subprocess.Popen(
            [sys.executable, __file__, f"--workers={k}", f"--concurrency={concurrency}",
             f"--seconds_per_token={seconds_per_token}", f"--seed={seed + 1000 * i}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
            for i, k in enumerate(sizes)]
        groups = []
        for p in self.procs:
            line = p.stdout.readline()
            if not line.startswith("READY "):
                self.close()
                raise RuntimeError(f"worker host did not start: {line!r}")
            groups.append(line.split()[1:])
        self.addresses = [g[i] for i in range(max(sizes)) for g in groups if i < len(g)]

    def cpu_s(self) -> float:
        """CPU seconds the host processes have used so far."""
        total = 0.0
        for p in self.procs:
            p.stdin.write("cpu\n")
            p.stdin.flush()
            total += float(p.stdout.readline().split()[1])
        return total

    def close(self) -> None:
        for p in self.procs:
            if p.stdin and not p.stdin.closed:
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    main(sys.argv[1:])
