"""Guardrails: skip non-finite updates, check that large parameters are sharded.

A step computes the new state, then keeps the old one (leaf by leaf, inside
the same jitted function) when the loss or the gradient is not finite; the
metrics say which (``skipped_nonfinite_loss`` / ``skipped_nonfinite_grad``).
The host then reports it (`report_skipped`): a warning naming the step, the
part (``actor`` / ``critic``), loss or gradient, and the likely cause read off
the step's metrics, and ``learner/nonfinite_skips`` = 1 in the step's record
(summed in ``summary.json``), so a voided batch is never silent.
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


# exp() of a float32 overflows past this: an importance ratio with a larger
# log ratio is inf (a rollout log-prob far below the learner's).
_F32_EXP_MAX = 88.0


def skipped_cause(metrics: dict[str, float]) -> str:
    """The likely cause of a skipped update, read off host metrics: an
    importance ratio that overflows (``*/max_abs_log_ratio`` > 88), or else
    the non-finite metrics by name."""
    causes = []
    for key, v in sorted(metrics.items()):
        if key.endswith("max_abs_log_ratio") and math.isfinite(v) and v > _F32_EXP_MAX:
            causes.append(f"importance ratio overflows: {key} = {v:.3g} (a rollout log-prob "
                          "far below the learner's; exp() of float32 is inf past 88)")
    bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
    if bad:
        causes.append("non-finite " + ", ".join(bad))
    return "; ".join(causes) or "no metric shows it (a non-finite gradient inside the model)"


def report_skipped(step: int, metrics: dict[str, float]) -> float:
    """Logs a warning when the step's update was skipped for a non-finite loss
    or gradient (``*/skipped_nonfinite_*`` metrics > 0) with `skipped_cause`;
    returns 1.0 if so, else 0.0 (``learner/nonfinite_skips``)."""
    flags = sorted(k for k, v in metrics.items() if "/skipped_nonfinite_" in k and v > 0)
    if not flags:
        return 0.0
    log.warning("learner step %d: update skipped (%s), the batch trained nothing: %s",
                step, ", ".join(flags), skipped_cause(metrics))
    return 1.0


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
