"""Command-line entry point: flags only; the work is ``sao.train`` and ``sao.workers``.

    python -m sao.main --config=experiments/quickstart.py --workdir=runs/quickstart
    python -m sao.main --config=experiments/sao_math.py:cpu --config.run.steps=5 --workdir=runs/x
    python -m sao.main --config=experiments/sao_math.py:cpu --workdir=runs/x --role=rollout --port=50151

Roles: ``all`` (learner + locally spawned rollout worker processes, the
default of ``sao-train``), ``learner`` (connects to ``rollout.worker_addresses``)
and ``rollout`` (one gRPC rollout worker, the default of ``sao-rollout``).

A multi-host learner runs ``--role=learner`` (or ``all``) once per host with
``--coordinator_address=HOST0:PORT --num_processes=N --process_id=I`` (or the
``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``
variables the launchers set): each process joins the JAX job before anything
else; with ``all`` only process 0 spawns the local workers (docs/multihost.md).
Console scripts: ``sao-train`` = :func:`run_train`, ``sao-rollout`` = :func:`run_rollout`.
"""
from __future__ import annotations

import os
import sys

import jax
from absl import app, flags
from ml_collections import config_flags
from rich.console import Console

from sao import components, config_checks, multihost, run_metrics, storage, train, workers
from sao.learner.mesh import ENV_PROCESS_ID, maybe_initialize_distributed

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "experiment file and variant: experiments/<file>.py[:variant]",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (checkpoints, metrics, summary)")
_ROLE = flags.DEFINE_enum("role", "all", ["all", "learner", "rollout"], "which part of the run")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "rollout role: bind address")
_PORT = flags.DEFINE_integer("port", 0, "rollout role: port (0 = any free port)")
_WORKER_INDEX = flags.DEFINE_integer("worker_index", 0, "rollout role: index (seeds, logs)")
_SGLANG_URL = flags.DEFINE_string("sglang_url", "", "rollout role with rollout.engine=sglang: server URL")
_ADDRESS_FILE = flags.DEFINE_string("address_file", "", "rollout role: write host:port here when serving")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", "", "multi-host learner: host:port of process 0 (else $JAX_COORDINATOR_ADDRESS)")
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", 0, "multi-host learner: processes in the job (else $JAX_NUM_PROCESSES)")
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", -1, "multi-host learner: this process's index, 0 = lead (else $JAX_PROCESS_ID)")
flags.mark_flags_as_required(["config", "workdir"])


def _config_argv(argv: list[str]) -> list[str]:
    """The ``--config`` / ``--config.*`` arguments, so that spawned workers load the same config."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--config" or (a.startswith("--config.") and "=" not in a):
            out += argv[i:i + 2]
            i += 2
            continue
        if a.startswith("--config=") or a.startswith("--config."):
            out.append(a)
        i += 1
    return out


def _add_experiments_root(argv: list[str]) -> None:
    """Lets experiment files ``import experiments.common`` wherever the command runs."""
    for i, a in enumerate(argv):
        path = a.split("=", 1)[1] if a.startswith("--config=") else (
            argv[i + 1] if a == "--config" and i + 1 < len(argv) else None)
        if path:
            root = os.path.dirname(os.path.dirname(os.path.abspath(path.split(":", 1)[0])))
            if root not in sys.path:
                sys.path.insert(0, root)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    cfg, workdir = _CONFIG.value, _WORKDIR.value
    try:
        config_checks.check(cfg)                          # --config.* overrides included
    except (ValueError, OSError) as e:                    # OSError: no loadable --config file
        raise app.UsageError(" ".join(line.strip() for line in str(e).splitlines())) from None
    if not storage.is_remote(workdir) and os.path.isfile(workdir):
        raise app.UsageError(f"--workdir {workdir} is a file; give a directory (created if absent)")
    if _ROLE.value == "rollout":
        workers.serve(cfg, workdir, host=_HOST.value, port=_PORT.value,
                      worker_index=_WORKER_INDEX.value, sglang_url=_SGLANG_URL.value,
                      address_file=_ADDRESS_FILE.value)
        return
    storage.check(workdir, "--workdir")                   # gs:// without gcsfs / credentials: now
    if cfg.model.init:
        storage.check(cfg.model.init, "model.init")
    if (done := train.finished_summary(cfg, workdir)) is not None:
        pid = _PROCESS_ID.value if _PROCESS_ID.value >= 0 else int(os.environ.get(ENV_PROCESS_ID) or 0)
        if pid == 0:                                      # the lead alone prints
            print(f"sao: {workdir} finished its {cfg.run.steps} steps; summary.json unchanged "
                  f"(raise --config.run.steps to continue)")
            Console().print(run_metrics.summary_table(done))
        return
    maybe_initialize_distributed(coordinator_address=_COORDINATOR.value,
                                 num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
    if _ROLE.value == "learner":
        train.train(cfg, workdir, addresses=workers.configured_addresses(cfg))
    elif not multihost.is_lead():                         # the lead's workers serve the job
        train.train(cfg, workdir, addresses=[])
    else:
        if any(spec.startswith("swe/") for spec in cfg.env.tasks):
            # Repository tasks are built (minutes) and cached once, here, so that the
            # workers spawned next read the cache instead of each building them.
            components.make_tasks(cfg)
        with workers.local_fleet(cfg, workdir, _config_argv(sys.argv[1:])) as addresses:
            train.train(cfg, workdir, addresses=addresses)


def _use_compilation_cache() -> str:
    """Turns on JAX's persistent compilation cache in ``<sao.storage.default_cache_dir()>/jax``
    unless ``JAX_COMPILATION_CACHE_DIR`` is set (empty: off); returns the directory.

    Every process of a run compiles the same steps (learner, engines of the workers), and so
    does every rerun and test run on the machine: a warm cache cut a tiny quick-start run's
    CPU time by ~60% (docs/quickstart.md). Every program is cached, however fast it
    compiled (``jax_persistent_cache_min_compile_time_secs`` 0 unless
    ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` is set): JAX's default (1 s) left most of
    a small model's programs out, and a 2-step tiny run's second start took 26.7 CPU-s
    instead of 13.8 (2026-12-04, docs/quickstart.md).
    """
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    directory = os.path.join(storage.default_cache_dir(), "jax")
    jax.config.update("jax_compilation_cache_dir", directory)
    return directory


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with a short error (exit 1) instead of a traceback when a
    ``--config.*`` override names no field (a missing ``--config`` file only fails when the
    config is first read: `main` reports it)."""
    try:
        return app.parse_flags_with_usage(argv)
    except (AttributeError, KeyError) as e:
        inner = e
        while inner.args and isinstance(inner.args[0], BaseException):
            inner = inner.args[0]
        detail = inner.args[0] if inner.args and isinstance(inner.args[0], str) else str(inner)
        lines = [line.strip() for line in detail.splitlines() if line.strip()]
        print(f"sao: bad --config: {' '.join(lines)}", file=sys.stderr)
        sys.exit(1)


def _run(default_role: str) -> None:
    _use_compilation_cache()
    if not any(a == "--role" or a.startswith("--role=") for a in sys.argv[1:]):
        sys.argv.insert(1, f"--role={default_role}")
    if not any(a.startswith(("--verbosity", "-v")) for a in sys.argv[1:]):
        sys.argv.insert(1, "--verbosity=-1")   # warnings and up: orbax logs every save at INFO
    _add_experiments_root(sys.argv[1:])
    app.run(main, flags_parser=_parse_flags)


def run_train() -> None:
    """``sao-train``: the learner with local or remote rollout workers (default role ``all``)."""
    _run("all")


def run_rollout() -> None:
    """``sao-rollout``: one rollout worker (default role ``rollout``)."""
    _run("rollout")


if __name__ == "__main__":
    _run("all")
