"""The learner's device mesh, multi-process start-up and batch placement.

Mesh axes are those of `sao.models.sharding` (``data``, ``fsdp``, ``tensor``,
``expert``). A `TrainBatch` is sharded on its batch dimension over the
``batch`` logical axis (``data`` x ``fsdp`` x ``expert``) and replicated over
``tensor``; parameters follow the model's logical-axis rules.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from sao.learner.batch import TrainBatch
from sao.models.sharding import logical_to_spec, make_mesh

# Environment variables read by `distributed_init_args` (the names JAX itself
# documents for ``jax.distributed.initialize``).
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


def mesh_from_config(cd: Mapping[str, Any] | Any, devices=None) -> Mesh:
    """A mesh from a config with integer fields ``data``, ``fsdp``, ``tensor``
    and optionally ``expert`` (missing ones default to 1).

    ``data = -1`` takes every device not used by the other axes.

    Raises:
      ValueError: unknown keys, non-positive sizes, or a product that differs
        from the device count.
    """
    items = dict(cd.items()) if hasattr(cd, "items") else dict(cd)
    allowed = {"data", "fsdp", "tensor", "expert"}
    unknown = sorted(set(items) - allowed)
    if unknown:
        raise ValueError(f"mesh config: unknown keys {unknown}; valid: {sorted(allowed)}")
    sizes = {k: int(items.get(k, 1)) for k in ("data", "fsdp", "tensor", "expert")}
    devs = list(jax.devices() if devices is None else devices)
    if sizes["data"] == -1:
        rest = sizes["fsdp"] * sizes["tensor"] * sizes["expert"]
        if rest <= 0 or len(devs) % rest:
            raise ValueError(f"mesh config: {len(devs)} devices are not divisible by "
                             f"fsdp*tensor*expert={rest}")
        sizes["data"] = len(devs) // rest
    if any(v <= 0 for v in sizes.values()):
        raise ValueError(f"mesh config: sizes must be positive, got {sizes}")
    return make_mesh(**sizes, devices=devs)


def distributed_init_args(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """Decides whether this process is part of a multi-process JAX job.

    Args:
      env: environment mapping (default ``os.environ``).

    Returns:
      kwargs for ``jax.distributed.initialize`` (``coordinator_address``,
      ``num_processes``, ``process_id``) when ``JAX_COORDINATOR_ADDRESS`` is
      set and ``JAX_NUM_PROCESSES`` > 1; None for a single-process run.

    Raises:
      ValueError: the variables are only partly set, not integers, or the
        process id is outside ``[0, num_processes)``.
    """
    env = os.environ if env is None else env
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


def maybe_initialize_distributed(env: Mapping[str, str] | None = None) -> bool:
    """Calls ``jax.distributed.initialize`` when `distributed_init_args` says
    so (before any other JAX call). Returns True if it did."""
    args = distributed_init_args(env)
    if args is None:
        return False
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

    Raises:
      ValueError: the batch has another B than ``batch_size``.
    """
    if batch.tokens.shape[0] != batch_size:
        raise ValueError(f"batch has {batch.tokens.shape[0]} rows, learner expects "
                         f"batch_size={batch_size}")
    return jax.device_put(batch, batch_sharding(mesh, (batch_size,)))
