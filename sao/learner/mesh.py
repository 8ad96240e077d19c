"""The learner's device mesh, multi-process start-up and batch placement.

Mesh axes are those of `sao.models.sharding` (``data``, ``fsdp``, ``tensor``,
``expert``). A `TrainBatch` is sharded on its batch dimension over the
``batch`` logical axis (``data`` x ``fsdp`` x ``expert``) and replicated over
``tensor``; parameters follow the model's logical-axis rules.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from sao.learner.batch import TrainBatch
from sao.models.sharding import MESH_AXES, logical_to_spec, make_mesh

# Environment variables read by `distributed_init_args` (the names JAX itself
# documents for ``jax.distributed.initialize``).
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
CPU_COLLECTIVE_TIMEOUT_FLAG = "--xla_cpu_collective_timeout_seconds"


def mesh_shape(cd: Mapping[str, Any] | Any, num_devices: int) -> dict[str, int]:
    """Axis sizes ``{data, fsdp, tensor, expert}`` of a mesh config on ``num_devices`` devices.

    ``cd`` has integer fields ``data``, ``fsdp``, ``tensor`` and optionally
    ``expert`` (missing ones are 1). One axis may be ``-1``: it takes every
    device the others leave (``fsdp=-1, expert=4`` is fsdp 8 on 32 devices).
    Pure arithmetic, no devices touched: launchers call it with the device
    count they ask for.

    Raises:
      ValueError: unknown keys, sizes other than positive or ``-1``, more than
        one ``-1``, or a mesh that does not fit ``num_devices`` (the message
        names the devices needed and found).
    """
    items = dict(cd.items()) if hasattr(cd, "items") else dict(cd)
    unknown = sorted(set(items) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"mesh config: unknown keys {unknown}; valid: {list(MESH_AXES)}")
    sizes = {k: int(items.get(k, 1)) for k in MESH_AXES}
    bad = {k: v for k, v in sizes.items() if v == 0 or v < -1}
    fill = [k for k, v in sizes.items() if v == -1]
    if bad or len(fill) > 1:
        raise ValueError(f"mesh config: sizes must be positive, or -1 on at most one axis "
                         f"(fill with the remaining devices); got {sizes}")
    fixed = math.prod(v for v in sizes.values() if v > 0)
    if fill:
        if num_devices % fixed:
            raise ValueError(f"mesh {sizes} needs a multiple of {fixed} devices "
                             f"({fill[0]} takes the rest); found {num_devices}")
        sizes[fill[0]] = num_devices // fixed
    elif fixed != num_devices:
        raise ValueError(f"mesh {sizes} needs {fixed} devices; found {num_devices} "
                         "(set one axis to -1 to fit any multiple)")
    return sizes


def mesh_from_config(cd: Mapping[str, Any] | Any, devices=None) -> Mesh:
    """The learner mesh of a mesh config (`mesh_shape`) over ``devices``
    (default: every device of the job, all processes).

    Raises:
      ValueError: see `mesh_shape` (e.g. "needs 64 devices; found 32").
    """
    devs = list(jax.devices() if devices is None else devices)
    return make_mesh(**mesh_shape(cd, len(devs)), devices=devs)


def distributed_init_args(env: Mapping[str, str] | None = None, *,
                          coordinator_address: str = "", num_processes: int = 0,
                          process_id: int = -1) -> dict[str, Any] | None:
    """Decides whether this process is part of a multi-process JAX job.

    Args:
      env: environment mapping (default ``os.environ``): ``JAX_COORDINATOR_ADDRESS``
        (``host:port`` of process 0), ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``.
      coordinator_address, num_processes, process_id: the same from the command
        line (``sao.main --coordinator_address`` ...); each one set (non-empty,
        > 0, >= 0) wins over its variable.

    Returns:
      kwargs for ``jax.distributed.initialize`` (``coordinator_address``,
      ``num_processes``, ``process_id``) when a coordinator is set and the
      number of processes is > 1; None for a single-process run.

    Raises:
      ValueError: the three are only partly set, not integers, or the
        process id is outside ``[0, num_processes)``.
    """
    env = dict(os.environ if env is None else env)
    for name, value in ((ENV_COORDINATOR, coordinator_address),
                        (ENV_NUM_PROCESSES, num_processes if num_processes > 0 else ""),
                        (ENV_PROCESS_ID, process_id if process_id >= 0 else "")):
        if value != "":
            env[name] = str(value)
    names = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)
    present = [n for n in names if env.get(n, "") != ""]
    if not present:
        return None
    if len(present) != len(names):
        missing = [n for n in names if n not in present]
        raise ValueError(f"multi-process start needs {names}; missing {missing}")
    try:
        num = int(env[ENV_NUM_PROCESSES])
        pid = int(env[ENV_PROCESS_ID])
    except ValueError as e:
        raise ValueError(f"{ENV_NUM_PROCESSES} and {ENV_PROCESS_ID} must be integers: {e}") from e
    if num < 1 or not 0 <= pid < num:
        raise ValueError(f"need 0 <= {ENV_PROCESS_ID}={pid} < {ENV_NUM_PROCESSES}={num}")
    if num == 1:
        return None
    return {"coordinator_address": env[ENV_COORDINATOR], "num_processes": num,
            "process_id": pid}


def maybe_initialize_distributed(env: Mapping[str, str] | None = None, **overrides) -> bool:
    """Joins the multi-process job `distributed_init_args` describes (``overrides``
    are its keyword arguments), before any other JAX call; CPU devices then
    talk through gloo collectives (TPU and GPU use their own).

    Returns True when this process is part of a distributed job (also when
    the runtime was already initialized), False for a single-process run.
    """
    if jax.distributed.is_initialized():
        return True
    args = distributed_init_args(env, **overrides)
    if args is None:
        return False
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # A gloo group whose processes first meet more than this apart fails (default 30 s: one
    # process compiling a step slower than another under load is enough).
    flags = os.environ.get("XLA_FLAGS", "")
    if CPU_COLLECTIVE_TIMEOUT_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {CPU_COLLECTIVE_TIMEOUT_FLAG}=3600".strip()
    jax.distributed.initialize(**args)
    return True


def batch_sharding(mesh: Mesh, shape: tuple[int, ...]) -> NamedSharding:
    """Sharding of one batch array ``[B, ...]``: B over the ``batch`` logical
    axis (replicated where B is not divisible), other dims replicated."""
    names = ("batch",) + (None,) * (len(shape) - 1)
    return NamedSharding(mesh, logical_to_spec(names, shape, mesh))


def put_batch(batch: TrainBatch, mesh: Mesh, batch_size: int) -> TrainBatch:
    """Places a host `TrainBatch` on ``mesh``: rows over the ``batch`` logical
    axis (`batch_sharding`), everything else replicated.

    Each process copies only the rows of its own devices
    (``jax.make_array_from_callback``), so in a multi-process job every process
    passes the same whole host batch (``sao.multihost`` sends the lead's
    trajectories to all) and gets the global array.

    Raises:
      ValueError: the batch has another B than ``batch_size``.
    """
    if batch.tokens.shape[0] != batch_size:
        raise ValueError(f"batch has {batch.tokens.shape[0]} rows, learner expects "
                         f"batch_size={batch_size}")
    sharding = batch_sharding(mesh, (batch_size,))

    def place(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
    return jax.tree.map(place, batch)


def host_scalar(value, dtype, sharding: NamedSharding) -> jax.Array:
    """A scalar the host knows, placed with ``sharding`` (replicated) without
    the cross-process equality check ``jax.device_put`` makes in a
    multi-process job (every process passes the same value)."""
    host = np.asarray(value, dtype)
    return jax.make_array_from_callback((), sharding, lambda index: host)
