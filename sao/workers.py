"""Rollout worker processes: one worker (``--role=rollout``), and a local fleet of them (``--role=all``).

:func:`serve` runs one gRPC rollout worker (engine + agent loop + envs built
from the config) until SIGINT / SIGTERM. :func:`local_fleet` starts
``rollout.num_workers`` such processes on 127.0.0.1 (``python -m sao.main
--role=rollout``, logs in ``<workdir>/workers/worker<i>.log``), yields their
addresses and stops them on exit; with ``rollout.worker_addresses`` set it
starts nothing and yields those. Spawned workers die with the learner and
one that dies alone is restarted on its port (``sao.supervisor``).

Credentials (docs/fleet.md "Security"): every run has a token file
(:func:`token_file`; the learner creates it, workers only read it), TLS from
``rollout.tls_*`` paths (:func:`fleet_security`); workers load weights only
from :func:`publish_root`.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from typing import Iterator

from sao import components
from sao.fleet.worker import WorkerConfig, agent_episode_fn, run
from sao.rpc import credentials
from sao.rpc.auth import Security
from sao.supervisor import Supervisor, die_with_parent


def token_file(cfg, workdir: str, *, create: bool = False) -> str:
    """Path of the run's token file: ``rollout.token_file``, else
    ``<workdir>/fleet.token``, written with a fresh random token (0600) when
    ``create`` and absent (the learner side; workers only read it)."""
    if cfg.rollout.token_file:
        return cfg.rollout.token_file
    if create:
        return credentials.ensure_token_file(workdir)
    return os.path.join(workdir, credentials.TOKEN_FILE)


def fleet_security(cfg, workdir: str, *, create: bool = False) -> Security:
    """Token and TLS of the fleet from ``rollout.token_file`` / ``tls_*``
    (``sao.rpc.credentials.load_security``; ``create`` as :func:`token_file`).

    Raises FileNotFoundError naming a missing file (a worker started before its
    learner created the token file: create it first, as launchers do),
    PermissionError for a token file others can read.
    """
    r = cfg.rollout
    return credentials.load_security(token_file=token_file(cfg, workdir, create=create),
                                     tls_cert=r.tls_cert, tls_key=r.tls_key, tls_ca=r.tls_ca,
                                     tls_server_name=r.tls_server_name)


def publish_root(cfg, workdir: str) -> str:
    """Where the learner publishes weights and the only place workers load
    them from: ``rollout.publish_root``, else ``<workdir>/publish``."""
    return cfg.rollout.publish_root or os.path.join(workdir, "publish")


def server_log_dir(workdir: str) -> str:
    """Where a worker's own SGLang server logs: ``<workdir>/workers`` for a
    local work dir, ``""`` (``/tmp``) for a remote one (``gs://...``)."""
    if "://" in workdir:
        return ""
    path = os.path.join(workdir, "workers")
    os.makedirs(path, exist_ok=True)
    return path


def serve(cfg, workdir: str, *, host: str = "127.0.0.1", port: int = 0, worker_index: int = 0,
          sglang_url: str = "", address_file: str = "") -> None:
    """Serves one rollout worker until SIGINT / SIGTERM.

    ``port=0`` binds any free port; ``address_file`` gets ``host:port`` once
    serving (written atomically); ``worker_index`` seeds the engine and names
    the worker. With ``rollout.engine="sglang"`` the worker starts and
    supervises its own server from ``rollout.sglang`` (log in
    :func:`server_log_dir`; stopped when the worker exits) or attaches to
    ``sglang_url`` / ``rollout.sglang.url_file`` (``sao.sglang_setup``).
    The worker reads the run's token file (:func:`fleet_security`; raises what
    it raises) and loads weights only from :func:`publish_root`.
    """
    die_with_parent()  # spawned by a learner (``spawn``): end with it
    # The worker's own lifecycle (serving address, weight loads) in its log at INFO, while
    # libraries stay at the process's verbosity (warnings: orbax logs every restore at INFO).
    logging.getLogger("sao").setLevel(logging.INFO)
    security = fleet_security(cfg, workdir)  # before anything slow: a missing token fails at once
    tokenizer = components.make_tokenizer(cfg)

    def make():
        engine = components.make_engine(cfg, seed=cfg.seed * 1000 + worker_index + 1,
                                        sglang_url=sglang_url, worker_index=worker_index,
                                        log_dir=server_log_dir(workdir))
        tasks = components.make_tasks(cfg)
        make_env = components.make_env_factory(cfg, tasks,
                                               clock=components.engine_clock(lambda: engine))
        sampling = components.sampling_params(cfg, tokenizer)
        if cfg.env.harness:  # a harness drives the episode through the worker's endpoint
            from sao.fleet.endpoint.wiring import harness_episode
            return engine, harness_episode(cfg, engine, tokenizer, security.token, tasks,
                                           make_env, sampling)
        episode = agent_episode_fn(engine, make_env, tokenizer, sampling,
                                   **components.episode_kwargs(cfg, tokenizer))
        return engine, episode

    def ready(address: str) -> None:
        if address_file:
            tmp = address_file + ".tmp"
            with open(tmp, "w") as f:
                f.write(address)
            os.replace(tmp, address_file)

    run(make, WorkerConfig(host=host, port=port, max_concurrency=cfg.rollout.max_concurrency,
                           worker_id=f"worker{worker_index}", security=security,
                           publish_root=publish_root(cfg, workdir),
                           max_version_jump=cfg.rollout.max_version_jump), ready=ready)


def spawn(cfg, workdir: str, config_argv: list[str], *, timeout_s: float = 300.0,
          restart: bool = True) -> tuple[Supervisor, list[str]]:
    """Starts ``rollout.num_workers`` worker processes; returns ``(supervisor, addresses)``.

    ``config_argv`` are the ``--config`` arguments of this process (the workers
    load the same config); the run's token file is created first and its path
    (never the token) passed on. Each worker dies with this process
    (``sao.supervisor.die_with_parent``); with ``restart`` one that exits is
    started again on its port (the dispatcher's link reconnects to it by
    itself). ``supervisor.stop()`` ends them. Raises RuntimeError if a worker
    exits or is not serving within ``timeout_s`` (the others are stopped).
    """
    wdir = os.path.join(workdir, "workers")
    os.makedirs(wdir, exist_ok=True)
    if not cfg.rollout.token_file:
        config_argv = [*config_argv, f"--config.rollout.token_file={token_file(cfg, workdir, create=True)}"]
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
           "XLA_FLAGS": " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                                 if "device_count" not in f)}
    supervisor, files = Supervisor(env), []

    def argv(i: int, port: int) -> list[str]:
        return [sys.executable, "-m", "sao.main", *config_argv, f"--workdir={workdir}",
                "--role=rollout", f"--port={port}", f"--worker_index={i}",
                f"--address_file={files[i]}"]

    for i in range(cfg.rollout.num_workers):
        files.append(os.path.join(wdir, f"worker{i}.addr"))
        if os.path.exists(files[i]):
            os.remove(files[i])
        supervisor.add(argv(i, 0), os.path.join(wdir, f"worker{i}.log"))
    deadline = time.monotonic() + timeout_s
    while not all(os.path.exists(f) for f in files):
        dead = [i for i in range(len(files)) if supervisor.proc(i).poll() is not None]
        if dead or time.monotonic() > deadline:
            supervisor.stop()
            raise RuntimeError(f"rollout workers {dead or 'all'} did not start; see {wdir}/*.log")
        time.sleep(0.2)
    addresses = []
    for i, f in enumerate(files):
        with open(f, encoding="utf-8") as fh:
            addresses.append(fh.read().strip())
        supervisor.set_argv(i, argv(i, int(addresses[i].rsplit(":", 1)[1])))  # restart: same port
    if restart:
        supervisor.watch()
    return supervisor, addresses


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
    supervisor, addresses = spawn(cfg, workdir, config_argv,
                                  timeout_s=float(cfg.rollout.get("worker_start_timeout_s", 300.0)))
    try:
        yield addresses
    finally:
        supervisor.stop()
