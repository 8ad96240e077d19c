"""Guardrails: skip non-finite updates, check that large parameters are sharded.

A step computes the new state, then keeps the old one (leaf by leaf, inside
the same jitted function) when the loss or the gradient is not finite; the
metrics say which (``skipped_nonfinite_loss`` / ``skipped_nonfinite_grad``).
"""
from __future__ import annotations

import logging
import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

log = logging.getLogger(__name__)


def tree_all_finite(tree) -> jax.Array:
    """bool[] scalar: every floating leaf of ``tree`` is finite (True for an
    empty tree). Non-float leaves are ignored."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
    if not leaves:
        return jnp.asarray(True)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def select_tree(ok: jax.Array, new, old):
    """``new`` where the scalar ``ok`` is True, else ``old`` (same structure)."""
    return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)


def finite_guard(loss: jax.Array, grads) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Decides whether an update may be applied.

    Args:
      loss: f32[] scalar loss.
      grads: gradient pytree.

    Returns:
      ``(ok bool[], metrics)`` with ``skipped_nonfinite_loss`` and
      ``skipped_nonfinite_grad`` as f32 0/1 (a non-finite loss is reported as
      a loss skip even if the gradient is also non-finite).
    """
    loss_ok = jnp.all(jnp.isfinite(loss))
    grad_ok = tree_all_finite(grads)
    ok = loss_ok & grad_ok
    return ok, {"skipped_nonfinite_loss": (~loss_ok).astype(jnp.float32),
                "skipped_nonfinite_grad": (loss_ok & ~grad_ok).astype(jnp.float32)}


def _path_str(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def unsharded_large_params(params, mesh: Mesh, min_size: int) -> list[str]:
    """Paths of array leaves with at least ``min_size`` elements that are fully
    replicated although ``mesh`` has more than one device (empty = fine)."""
    if mesh.size <= 1:
        return []
    bad = []
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        size = math.prod(getattr(x, "shape", ()))
        sharding = getattr(x, "sharding", None)
        if size >= min_size and sharding is not None and sharding.is_fully_replicated:
            bad.append(_path_str(path))
    return bad


def check_sharded(params, mesh: Mesh, *, min_size: int, mode: str = "warn",
                  name: str = "params") -> list[str]:
    """Warns about or rejects large replicated parameters.

    Args:
      params: parameter pytree of placed arrays.
      mesh: the learner mesh.
      min_size: element-count threshold.
      mode: ``"off"``, ``"warn"`` (log a warning) or ``"raise"``.
      name: label used in the message (``"actor"``, ``"critic"``).

    Returns:
      The offending parameter paths.

    Raises:
      ValueError: in ``"raise"`` mode when any path is found, or on an unknown
        mode.
    """
    if mode not in ("off", "warn", "raise"):
        raise ValueError(f"shard check mode must be off|warn|raise, got {mode!r}")
    if mode == "off":
        return []
    bad = unsharded_large_params(params, mesh, min_size)
    if bad:
        msg = (f"{name}: {len(bad)} parameters with >= {min_size} elements are fully "
               f"replicated on a {mesh.size}-device mesh: {', '.join(bad)}")
        if mode == "raise":
            raise ValueError(msg)
        log.warning(msg)
    return bad
