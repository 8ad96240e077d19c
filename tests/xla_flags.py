"""XLA flags of the test session (tests/README.md, "Time").

The suite's in-process JAX programs are tiny models: their cost is compiling, not
running. ``--xla_backend_optimization_level=0`` skips LLVM's optimisation passes,
which cut the CPU time of ``learner/test_update.py`` + ``algo/test_algo_recurrence.py``
from 156 to 95 CPU-s (2026-12-04); ``conftest.py`` sets it for the pytest processes
only. Child processes keep XLA's defaults: runs of ``python -m sao.main`` sample many
tokens, and with the flag they took 40-100% more CPU in a full suite (the smoke sweep
62 -> 126 CPU-s, the online drift run 37 -> 73), and the SmolLM2 run's second update
106 CPU-s against 49. The full-scale meshes child (one update per variant, no sampling)
asks for it itself.
"""
FAST_COMPILE = "--xla_backend_optimization_level=0"


def cpu_devices(n: int) -> str:
    """``XLA_FLAGS`` for a test's child process: ``n`` CPU devices, XLA's defaults."""
    return f"--xla_force_host_platform_device_count={n}"
