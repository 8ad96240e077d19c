"""The learner mesh a launch will build, checked on the launching machine before anything starts.

A launcher knows how many devices its learner will find (``launch/tpu_vm.py``:
the slice's chips; ``launch/gpu_slurm.py``: nodes x GPUs per node). It loads
the experiment config exactly as ``sao.main`` will (``--set`` overrides
included) and sizes its mesh with ``sao.learner.mesh.mesh_shape`` for that
count, so a mesh that cannot fit fails here, naming the devices needed and
found, instead of on every host after the install.
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sao.analysis import experiment_config  # noqa: E402
from sao.learner.mesh import mesh_shape  # noqa: E402


def learner_mesh(config: str, overrides: Sequence[str], num_devices: int, where: str) -> dict[str, int]:
    """Axis sizes of the config's ``model.mesh`` on ``num_devices`` devices.

    Args:
      config: ``experiments/<file>.py[:variant]``; overrides: the launcher's
        ``--set KEY=VALUE`` list; where: what the devices are, for the message
        (e.g. ``"v5p-64 (32 chips)"``).
    Raises:
      SystemExit: the mesh does not fit (the message names needed and found).
    """
    cfg = experiment_config(config, list(overrides))
    try:
        return mesh_shape(cfg.model.mesh, num_devices)
    except ValueError as e:
        raise SystemExit(f"{config}: the learner mesh does not fit {where}: {e}") from e
