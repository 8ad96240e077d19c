"""XLA flags of the test session (tests/README.md, "Time").

The suite's JAX programs are tiny models: their cost is compiling, not running.
``--xla_backend_optimization_level=0`` skips LLVM's optimisation passes, which
cut the CPU time of ``learner/test_update.py`` + ``algo/test_algo_recurrence.py``
from 156 to 95 CPU-s (2026-12-04). It is no setting for compute-bound runs: the
SmolLM2 run's second update took 106 CPU-s with it against 49 without, so that
run, and the launcher runs (a user's environment), keep XLA's defaults.
The pytest processes get it from ``conftest.py``; a child process gets it from
``cpu_devices``.
"""
FAST_COMPILE = "--xla_backend_optimization_level=0"


def cpu_devices(n: int) -> str:
    """``XLA_FLAGS`` for a test's child process: ``n`` CPU devices, compiled fast."""
    return f"--xla_force_host_platform_device_count={n} {FAST_COMPILE}"
