"""TPU slice arithmetic shared by the TPU launcher and the cluster in a box (standard library only)."""
from __future__ import annotations

CHIPS_PER_HOST = 4          # v4 / v5p hosts have 4 chips


def num_hosts(accelerator: str) -> int:
    """Hosts of a TPU slice from its type: ``v5p-64`` is 64 TensorCores = 32 chips = 8 hosts.

    Raises ValueError on a malformed accelerator type.
    """
    try:
        gen, cores = accelerator.split("-")
        cores = int(cores)
    except ValueError as e:
        raise ValueError(f"accelerator type like 'v5p-64' expected, got {accelerator!r}") from e
    chips = cores // 2 if gen in ("v4", "v5p") else cores   # v4/v5p count TensorCores, 2 per chip
    return max(1, chips // CHIPS_PER_HOST)


def chips_per_host(accelerator: str) -> int:
    """Chips each host of the slice has (fewer than 4 on a slice smaller than a host)."""
    gen, cores = accelerator.split("-")
    chips = int(cores) // 2 if gen in ("v4", "v5p") else int(cores)
    return min(CHIPS_PER_HOST, max(1, chips))


# Cloud TPU VM software versions (gcloud ``--version``) per generation, as Google's Cloud
# TPU documentation lists them for JAX; another generation needs ``--runtime``.
RUNTIMES = {"v4": "tpu-ubuntu2204-base", "v5litepod": "v2-alpha-tpuv5-lite",
            "v5p": "v2-alpha-tpuv5", "v6e": "v2-alpha-tpuv6e"}


def default_runtime(accelerator: str) -> str:
    """The TPU VM software version for ``accelerator`` (``v4-8`` -> ``tpu-ubuntu2204-base``).

    Raises ValueError for a generation not in ``RUNTIMES``.
    """
    gen = accelerator.split("-")[0]
    if gen not in RUNTIMES:
        raise ValueError(f"no default TPU runtime for {accelerator!r} (known: {', '.join(RUNTIMES)}); "
                         f"pass --runtime")
    return RUNTIMES[gen]
