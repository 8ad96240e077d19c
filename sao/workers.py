"""Rollout worker processes: one worker (``--role=rollout``), and a local fleet of them (``--role=all``).

:func:`serve` runs one gRPC rollout worker (engine + agent loop + envs built
from the config) until SIGINT / SIGTERM. :func:`local_fleet` starts
``rollout.num_workers`` such processes on 127.0.0.1 (``python -m sao.main
--role=rollout``, logs in ``<workdir>/workers/worker<i>.log``), yields their
addresses and stops them on exit; with ``rollout.worker_addresses`` set it
starts nothing and yields those.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Iterator

from sao import components
from sao.fleet.worker import WorkerConfig, agent_episode_fn, run
from sao.rpc.auth import Security


def read_token(path: str) -> str:
    """The shared secret in ``path`` (stripped); ``""`` (no auth) when ``path`` is empty."""
    if not path:
        return ""
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


def serve(cfg, workdir: str, *, host: str = "127.0.0.1", port: int = 0, worker_index: int = 0,
          sglang_url: str = "", address_file: str = "") -> None:
    """Serves one rollout worker until SIGINT / SIGTERM.

    ``port=0`` binds any free port; ``address_file`` gets ``host:port`` once
    serving (written atomically); ``worker_index`` seeds the engine and names
    the worker; ``sglang_url`` is the server of ``rollout.engine="sglang"``.
    """
    tokenizer = components.make_tokenizer(cfg)

    def make():
        engine = components.make_engine(cfg, seed=cfg.seed * 1000 + worker_index + 1,
                                        sglang_url=sglang_url)
        make_env = components.make_env_factory(cfg, components.make_tasks(cfg),
                                               clock=components.engine_clock(lambda: engine))
        episode = agent_episode_fn(engine, make_env, tokenizer, components.sampling_params(cfg, tokenizer),
                                   **components.episode_kwargs(cfg, tokenizer))
        return engine, episode

    def ready(address: str) -> None:
        if address_file:
            tmp = address_file + ".tmp"
            with open(tmp, "w") as f:
                f.write(address)
            os.replace(tmp, address_file)

    security = Security(token=read_token(cfg.rollout.token_file))
    run(make, WorkerConfig(host=host, port=port, max_concurrency=cfg.rollout.max_concurrency,
                           worker_id=f"worker{worker_index}", security=security), ready=ready)


def spawn(cfg, workdir: str, config_argv: list[str], *,
          timeout_s: float = 300.0) -> tuple[list[subprocess.Popen], list[str]]:
    """Starts ``rollout.num_workers`` worker processes; returns ``(processes, addresses)``.

    ``config_argv`` are the ``--config`` arguments of this process (the workers
    load the same config). Raises RuntimeError if a worker exits or is not
    serving within ``timeout_s`` (the others are stopped).
    """
    wdir = os.path.join(workdir, "workers")
    os.makedirs(wdir, exist_ok=True)
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
           "XLA_FLAGS": " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                                 if "device_count" not in f)}
    procs, files = [], []
    for i in range(cfg.rollout.num_workers):
        addr = os.path.join(wdir, f"worker{i}.addr")
        if os.path.exists(addr):
            os.remove(addr)
        argv = [sys.executable, "-m", "sao.main", *config_argv, f"--workdir={workdir}",
                "--role=rollout", "--port=0", f"--worker_index={i}", f"--address_file={addr}"]
        with open(os.path.join(wdir, f"worker{i}.log"), "w") as log:
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
        files.append(addr)
    deadline = time.monotonic() + timeout_s
    while not all(os.path.exists(f) for f in files):
        dead = [i for i, p in enumerate(procs) if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            stop(procs)
            raise RuntimeError(f"rollout workers {dead or 'all'} did not start; see {wdir}/*.log")
        time.sleep(0.2)
    addresses = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            addresses.append(fh.read().strip())
    return procs, addresses


def stop(procs: list[subprocess.Popen]) -> None:
    """Terminates the processes; kills those still running after 10 s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def configured_addresses(cfg) -> list[str]:
    """``rollout.worker_addresses`` as a list (``[]`` when unset)."""
    return [a for a in cfg.rollout.worker_addresses.split(",") if a]


@contextlib.contextmanager
def local_fleet(cfg, workdir: str, config_argv: list[str]) -> Iterator[list[str]]:
    """Yields worker addresses: ``rollout.worker_addresses`` if set, else those of
    :func:`spawn`'s processes, which are stopped when the block exits."""
    if configured_addresses(cfg):
        yield configured_addresses(cfg)
        return
    procs, addresses = spawn(cfg, workdir, config_argv)
    try:
        yield addresses
    finally:
        stop(procs)
