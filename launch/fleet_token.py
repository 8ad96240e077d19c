"""The run's fleet token (and TLS files) for launchers: made before any worker starts, copied to machines.

Every role of a run reads one token file (``rollout.token_file``;
``sao.rpc.credentials``). A launcher creates it before it starts any worker
(a worker without it exits at start, and one bound to ``0.0.0.0`` would
refuse to serve anyway), then hands every role its *path*, never the token
(``ps`` shows command lines). On a shared file system the path is enough
(Slurm); machines without one get a copy made with ``scp`` and kept at mode
0600 (TPU VMs and their fleet machines).
"""
from __future__ import annotations

import os

from launch.common import Step
from sao.rpc.credentials import TOKEN_FILE

REMOTE_DIR = "$HOME/.sao"           # on remote machines (expanded by their shell)
_CREATE = ("import sys; from sao.rpc.credentials import ensure_token_file; "
           "print(ensure_token_file(sys.argv[1]))")


def create_step(directory: str, python: str) -> Step:
    """Creates ``<directory>/fleet.token`` (random, 0600) unless it exists (a resumed run keeps it)."""
    return Step("local", (python, "-c", _CREATE, directory))


def token_path(directory: str) -> str:
    return os.path.join(directory, TOKEN_FILE)


def configured(overrides: list[str], key: str) -> str | None:
    """The value ``--set key=VALUE`` gives (the last one), else None."""
    values = [o.split("=", 1)[1] for o in overrides if o.startswith(f"{key}=")]
    return values[-1] if values else None


def remote_path(local: str) -> str:
    """Where :func:`tpu_copy_steps` / :func:`vm_copy_steps` put ``local`` on a remote machine."""
    return f"{REMOTE_DIR}/{os.path.basename(local)}"


def tpu_copy_steps(files: list[str], tpu: str, zone: str) -> list[Step]:
    """Copies ``files`` to every host of TPU VM ``tpu`` under :data:`REMOTE_DIR`, mode 0600."""
    gcloud = ("gcloud", "compute", "tpus", "tpu-vm")
    return [Step("local", (*gcloud, "ssh", tpu, f"--zone={zone}", "--worker=all",
                           f"--command=mkdir -p -m 700 {REMOTE_DIR}")),
            Step("local", (*gcloud, "scp", *files, f"{tpu}:.sao/", f"--zone={zone}", "--worker=all")),
            Step("local", (*gcloud, "ssh", tpu, f"--zone={zone}", "--worker=all",
                           f"--command=chmod 600 {REMOTE_DIR}/*"))]


def vm_copy_steps(files: list[str], machine: str, zone: str) -> list[Step]:
    """Copies ``files`` to the VM ``machine`` under :data:`REMOTE_DIR`, mode 0600."""
    return [Step("local", ("gcloud", "compute", "ssh", machine, f"--zone={zone}",
                           f"--command=mkdir -p -m 700 {REMOTE_DIR}")),
            Step("local", ("gcloud", "compute", "scp", *files, f"{machine}:.sao/", f"--zone={zone}")),
            Step("local", ("gcloud", "compute", "ssh", machine, f"--zone={zone}",
                           f"--command=chmod 600 {REMOTE_DIR}/*"))]
