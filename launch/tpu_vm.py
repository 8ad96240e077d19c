"""Cloud TPU VM launch (multi-host): one learner program per TPU host, rollout fleet on separate machines.

    python launch/tpu_vm.py --config=experiments/sao_math.py:qwen3_30b_a3b \
        --workdir=gs://BUCKET/sao_math --tpu=sao-v5p --zone=us-east5-a \
        --accelerator=v5p-64 --fleet=fleet-0,fleet-1 --dry-run

Steps: create the TPU VM (all hosts), install SAO on every host, start the
rollout fleet (``launch/sglang_fleet.py`` on each GPU fleet machine: SGLang
servers + our rollout workers), then run ``sao.main --role=learner`` on every
TPU host at once (``--worker=all``). Each host joins one JAX job through
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
from launch.common import Step, add_common_flags, dry_run_or_run, sao_main  # noqa: E402

CHIPS_PER_HOST = 4          # v4 / v5p hosts have 4 chips
COORDINATOR_PORT = 8476
WORKER_PORT = 50151
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


def build(args) -> list[Step]:
    gcloud = ["gcloud", "compute", "tpus", "tpu-vm"]
    where = f"--zone={args.zone}"
    hosts = num_hosts(args.accelerator)
    setup = (f"git clone {args.repo} sao || (cd sao && git pull); cd sao && "
             "python3.11 -m venv .venv && .venv/bin/pip install -q -e . 'jax[tpu]'")
    steps = [
        Step("local", (*gcloud, "create", args.tpu, where, f"--accelerator-type={args.accelerator}",
                       f"--version={args.runtime}")),
        Step("local", (*gcloud, "ssh", args.tpu, where, "--worker=all", f"--command={setup}")),
    ]
    # Credentials: made here, copied (0600) to each machine before its role starts; paths only.
    learner_files, worker_files = [], []                 # local paths to copy
    learner_set, worker_set = list(args.set), list(args.set)   # overrides naming the copies
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
                     f"--model={args.fleet_model} --host=0.0.0.0"
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
    parser.add_argument("--fleet_model", default="gs://BUCKET/models/base", help="HF dir the fleet starts from")
    parser.add_argument("--token_dir", default="", help="local directory of the run's token file "
                        "(default ~/.sao/<tpu>; reused on a relaunch)")
    parser.add_argument("--tls_cert", default="", help="local PEM certificate the workers serve with")
    parser.add_argument("--tls_key", default="", help="local PEM private key of --tls_cert")
    parser.add_argument("--tls_ca", default="", help="local PEM CA (or the self-signed --tls_cert) "
                        "the learner verifies workers with")
    args = parser.parse_args(argv)
    args.fleet = [m for m in args.fleet.split(",") if m]
    return dry_run_or_run(build(args), args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
