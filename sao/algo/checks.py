"""Range checks of hyper-parameters given to the kernels as concrete values.

A kernel argument may be a Python number, a NumPy scalar or array, a concrete
JAX array, or a tracer (inside ``jit`` / ``grad``). Concrete values are
checked eagerly and raise ``ValueError`` naming the argument; traced values
cannot be inspected and pass unchecked (the caller's config layer validates
them before tracing).
"""
from __future__ import annotations

import jax
import numpy as np


def check_range(name: str, x, *, low: float | None = None, high: float | None = None,
                low_inclusive: bool = True, high_inclusive: bool = True) -> None:
    """Raises ValueError unless every entry of a concrete ``x`` is a finite real in range.

    Booleans, complex numbers, strings and values too large for float64 are
    refused with a ValueError naming ``name`` too.

    Args:
      name: argument name for the message.
      x: scalar or array (tracers are skipped, see module doc).
      low, high: bounds (None: unbounded on that side).
      low_inclusive, high_inclusive: whether each bound itself is allowed.
    """
    if isinstance(x, jax.core.Tracer):
        return
    raw = np.asarray(x)
    # b: bool, c: complex, U/S: strings, O: ints beyond float64 and other objects
    # (bfloat16 has kind V and converts like any float).
    if raw.dtype.kind in "bcUSO":
        raise ValueError(f"{name} must be a real number or array of them, got {x!r}")
    arr = raw.astype(np.float64)
    if arr.size == 0:
        return
    ok = np.all(np.isfinite(arr))
    if ok and low is not None:
        ok = np.all(arr >= low) if low_inclusive else np.all(arr > low)
    if ok and high is not None:
        ok = np.all(arr <= high) if high_inclusive else np.all(arr < high)
    if not ok:
        lo = "-inf" if low is None else f"{low}"
        hi = "inf" if high is None else f"{high}"
        interval = f"{'[' if low_inclusive and low is not None else '('}{lo}, " \
                   f"{hi}{']' if high_inclusive and high is not None else ')'}"
        raise ValueError(f"{name} must be finite and in {interval}, got {x}")
