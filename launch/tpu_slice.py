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
