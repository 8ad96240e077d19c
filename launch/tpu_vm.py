"""Cloud TPU VM launch (multi-host): one learner program per TPU host, rollout fleet on separate machines.

    python launch/tpu_vm.py --config=experiments/sao_math.py:qwen3_30b_a3b \
        --workdir=gs://BUCKET/sao_math --tpu=sao-v5p --zone=us-east5-a \
        --accelerator=v5p-64 --fleet=fleet-0,fleet-1 --dry-run

Steps: create the TPU VM (all hosts); install SAO on every host; set up each
GPU fleet machine (SAO, and SGLang in its own environment with ``make venv
sglang-real-venv``); mount the work dir's bucket with gcsfuse at ``--mount``
on every TPU host and fleet machine; start the rollout fleet
(``launch/sglang_fleet.py`` on each fleet machine: rollout workers, each
starting its own SGLang server); then run ``sao.main --role=learner`` on every
TPU host at once (``--worker=all``).

Where weights travel: the learner publishes into ``rollout.publish_root`` =
``<mount>/<path of the work dir in its bucket>/publish`` (``gs://BUCKET/run``
-> ``/mnt/sao-bucket/run/publish``), a path every machine reads and writes
through its own mount of the same bucket; SGLang servers load the HF export of
each version from there, and workers accept only uris under it. The
machines' service accounts need read/write access to the bucket. The
workers' tokenizer comes from ``--fleet_model`` (default the base model in the
bucket, through the mount), which the learner also starts from. Each host joins one JAX job through
``jax.distributed.initialize`` (``JAX_COORDINATOR_ADDRESS`` = host 0,
``JAX_NUM_PROCESSES`` = hosts, ``JAX_PROCESS_ID`` = the host's worker number
from the metadata server); only process 0 talks to the fleet.

Credentials (``launch/fleet_token.py``): the run's token file is created
locally in ``--token_dir`` (kept for a resume), copied with mode 0600 to every
TPU host and fleet machine (``~/.sao/``) before anything starts there, and
every role gets its path. ``--tls_cert`` / ``--tls_key`` (for the workers) and
``--tls_ca`` (for the learner) travel the same way and set ``rollout.tls_*``.
"""
from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launch import fleet_token  # noqa: E402
from launch.common import Step, add_common_flags, check_config, dry_run_or_run, sao_main  # noqa: E402
from launch.mesh_check import learner_mesh  # noqa: E402

CHIPS_PER_HOST = 4          # v4 / v5p hosts have 4 chips
COORDINATOR_PORT = 8476
WORKER_PORT = 50151
DEFAULT_MOUNT = "/mnt/sao-bucket"
SGLANG_PYTHON = "$HOME/.cache/sao/sglang-0.5.23/bin/python"  # what `make sglang-real-venv` installs
# gcsfuse from Google's apt repository (cloud.google.com/storage/docs/gcsfuse-install).
GCSFUSE_INSTALL = (
    "(command -v gcsfuse >/dev/null || ("
    "curl -s https://packages.cloud.google.com/apt/doc/apt-key.gpg | "
    "sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null && "
    "echo \"deb [signed-by=/usr/share/keyrings/cloud.google.asc] https://packages.cloud.google.com/apt "
    "gcsfuse-$(lsb_release -c -s) main\" | sudo tee /etc/apt/sources.list.d/gcsfuse.list && "
    "sudo apt-get update -q && sudo apt-get install -y -q gcsfuse))")
WORKER_NUMBER = ("$(curl -s -H Metadata-Flavor:Google http://metadata.google.internal/"
                 "computeMetadata/v1/instance/attributes/agent-worker-number)")


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


def bucket_path(workdir: str) -> tuple[str, str]:
    """``gs://BUCKET/a/b`` -> ``("BUCKET", "a/b")``; raises ValueError for another scheme."""
    if not workdir.startswith("gs://") or len(workdir) <= len("gs://"):
        raise ValueError(f"--workdir must be gs://BUCKET/... (every machine mounts the bucket), "
                         f"got {workdir!r}")
    bucket, _, path = workdir[len("gs://"):].partition("/")
    return bucket, path.strip("/")


def mount_command(bucket: str, mount: str) -> str:
    """Installs gcsfuse if absent and mounts ``bucket`` at ``mount`` (nothing if mounted)."""
    return (f"{GCSFUSE_INSTALL} && sudo mkdir -p {mount} && sudo chown $USER {mount} && "
            f"(mountpoint -q {mount} || gcsfuse --implicit-dirs --rename-dir-limit=1000000 "
            f"{bucket} {mount})")


def build(args) -> list[Step]:
    gcloud = ["gcloud", "compute", "tpus", "tpu-vm"]
    where = f"--zone={args.zone}"
    hosts = num_hosts(args.accelerator)
    bucket, path = bucket_path(args.workdir)
    publish_root = "/".join(p for p in (args.mount, path, "publish") if p)
    fleet_model = args.fleet_model or f"{args.mount}/models/base"
    clone = f"(git clone {args.repo} sao || (cd sao && git pull))"
    setup = (f"{clone} && cd sao && python3.11 -m venv .venv && "
             f".venv/bin/pip install -q -e . 'jax[tpu]' && {mount_command(bucket, args.mount)}")
    steps = [
        Step("local", (*gcloud, "create", args.tpu, where, f"--accelerator-type={args.accelerator}",
                       f"--version={args.runtime}")),
        Step("local", (*gcloud, "ssh", args.tpu, where, "--worker=all", f"--command={setup}")),
    ]
    fleet_setup = (f"{clone} && cd sao && make venv sglang-real-venv && "
                   f"{mount_command(bucket, args.mount)}")
    for machine in args.fleet:  # SAO, SGLang (once per machine, in ~/.cache/sao) and the mount
        steps.append(Step("local", ("gcloud", "compute", "ssh", machine, where,
                                    f"--command={fleet_setup}")))
    shared = [f"rollout.publish_root={publish_root}", f"model.init={fleet_model}"]
    # Credentials: made here, copied (0600) to each machine before its role starts; paths only.
    learner_files, worker_files = [], []                 # local paths to copy
    learner_set, worker_set = [*args.set, *shared], [*args.set, *shared]  # + the copies' paths
    if not fleet_token.configured(args.set, "rollout.token_file"):
        token = fleet_token.token_path(os.path.expanduser(args.token_dir or f"~/.sao/{args.tpu}"))
        steps.append(fleet_token.create_step(os.path.dirname(token), sys.executable))
        learner_files.append(token)
        worker_files.append(token)
        learner_set.append(f"rollout.token_file={fleet_token.remote_path(token)}")
        worker_set.append(learner_set[-1])
    for key, path, files, sets in (("tls_cert", args.tls_cert, worker_files, worker_set),
                                   ("tls_key", args.tls_key, worker_files, worker_set),
                                   ("tls_ca", args.tls_ca, learner_files, learner_set)):
        if path:
            files.append(path)
            sets.append(f"rollout.{key}={fleet_token.remote_path(path)}")
    if learner_files:
        steps += fleet_token.tpu_copy_steps(learner_files, args.tpu, args.zone)
    addresses = []
    for machine in args.fleet:
        if worker_files:
            steps += fleet_token.vm_copy_steps(worker_files, machine, args.zone)
        fleet_cmd = (f"cd sao && .venv/bin/python launch/sglang_fleet.py --config={args.config} "
                     f"--workdir={args.workdir} --servers={args.servers_per_machine} "
                     f"--model={fleet_model} --host=0.0.0.0 --sglang_python={SGLANG_PYTHON}"
                     + "".join(f" --set {o}" for o in worker_set))
        steps.append(Step("local", ("gcloud", "compute", "ssh", machine, where,
                                    f"--command={fleet_cmd}"), background=True))
        addresses += [f"{machine}:{WORKER_PORT + i}" for i in range(args.servers_per_machine)]
    learner = " ".join(sao_main(args.config, args.workdir, "learner", python=".venv/bin/python",
                                overrides=[*learner_set, "rollout.worker_addresses=" + ",".join(addresses)]))
    env = (f"JAX_COORDINATOR_ADDRESS={args.tpu}-w-0:{COORDINATOR_PORT} "
           f"JAX_NUM_PROCESSES={hosts} JAX_PROCESS_ID={WORKER_NUMBER}")
    steps.append(Step("local", (*gcloud, "ssh", args.tpu, where, "--worker=all",
                                f"--command=cd sao && {env} {learner}")))
    return steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_flags(parser)
    parser.add_argument("--tpu", default="sao-tpu", help="TPU VM name")
    parser.add_argument("--zone", default="us-east5-a")
    parser.add_argument("--accelerator", default="v5p-64", help="TPU slice type")
    parser.add_argument("--runtime", default="v2-alpha-tpuv5", help="TPU VM software version")
    parser.add_argument("--repo", default="https://github.com/YOUR_ORG/sao.git")
    parser.add_argument("--fleet", default="", help="comma-separated GPU fleet machine names")
    parser.add_argument("--servers_per_machine", type=int, default=8, help="SGLang servers per fleet machine")
    parser.add_argument("--fleet_model", default="",
                        help="base model's HF dir as every machine sees it (model.init of the "
                        "learner and the workers; default <mount>/models/base)")
    parser.add_argument("--mount", default=DEFAULT_MOUNT,
                        help="where every machine mounts the work dir's bucket (gcsfuse)")
    parser.add_argument("--token_dir", default="", help="local directory of the run's token file "
                        "(default ~/.sao/<tpu>; reused on a relaunch)")
    parser.add_argument("--tls_cert", default="", help="local PEM certificate the workers serve with")
    parser.add_argument("--tls_key", default="", help="local PEM private key of --tls_cert")
    parser.add_argument("--tls_ca", default="", help="local PEM CA (or the self-signed --tls_cert) "
                        "the learner verifies workers with")
    args = parser.parse_args(argv)
    args.fleet = [m for m in args.fleet.split(",") if m]
    try:
        bucket_path(args.workdir)
    except ValueError as e:
        parser.error(str(e))
    check_config(args)
    chips = num_hosts(args.accelerator) * CHIPS_PER_HOST
    learner_mesh(args.config, args.set, chips, f"{args.accelerator} ({chips} chips)")
    return dry_run_or_run(build(args), args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
