"""Shared pieces for fleet tests: simulated workers and a tiny deterministic learner."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import numpy as np

from sao.fleet import sim
from sao.fleet.local import ThreadedWorker
from sao.fleet.worker import WorkerConfig
from sao.types import Trajectory

VOCAB = 272


def sim_worker(seconds_per_token: float = 2e-4, max_concurrency: int = 16, **config) -> ThreadedWorker:
    def make():
        engine = sim.SimulatedEngine(seconds_per_token=seconds_per_token, chunk_tokens=8)
        return engine, sim.make_sim_episode_fn(engine)
    return ThreadedWorker(make, WorkerConfig(max_concurrency=max_concurrency, **config))


@contextlib.contextmanager
def sim_workers(n: int, **kw):
    workers = []
    try:
        for _ in range(n):
            workers.append(sim_worker(**kw))
        yield workers
    finally:
        for w in workers:
            w.stop()


class SubprocessWorker:
    """``python -m sao.fleet.sim_worker`` in its own process (for SIGKILL tests)."""

    def __init__(self, port: int = 0, seconds_per_token: float = 1e-3, max_concurrency: int = 8,
                 token: str = ""):
        env = dict(os.environ, SAO_FLEET_TOKEN=token)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sao.fleet.sim_worker", f"--port={port}",
             f"--seconds_per_token={seconds_per_token}", f"--max_concurrency={max_concurrency}"],
            stdout=subprocess.PIPE, env=env, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.proc.kill()
            raise RuntimeError(f"worker did not start: {line!r}")
        self.address = line.split()[1]
        self.port = int(self.address.rsplit(":", 1)[1])

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def wait_until(pred, timeout: float = 20.0, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(interval)


def prompts(n: int, length: int = 16, prefix: str = "p") -> list[dict]:
    return [{"prompt_id": f"{prefix}{i}", "length": length, "reward": float(i % 2)}
            for i in range(n)]


def good_trajectory(prompt_id: str = "p", n_prompt: int = 3, n_action: int = 4,
                    version: int = 0, reward: float = 1.0) -> Trajectory:
    n = n_prompt + n_action
    rng = np.random.default_rng(abs(hash(prompt_id)) % 2**32)
    return Trajectory(
        tokens=rng.integers(0, 256, n), action_mask=[False] * n_prompt + [True] * n_action,
        rollout_logprobs=[0.0] * n_prompt + list(-rng.uniform(0.1, 2.0, n_action)),
        policy_version=[version] * n, reward=reward, finish="stop",
        prompt_id=prompt_id, trajectory_id="")
