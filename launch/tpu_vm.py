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
import shlex
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from launch import venv_check
    venv_check.ensure()
from launch import fleet_token, install  # noqa: E402
from launch.common import (Step, add_common_flags, check_config, dry_run_or_run, expandable,  # noqa: E402
                           print_locations, sao_main)
from launch.mesh_check import learner_mesh  # noqa: E402
from launch.tpu_slice import CHIPS_PER_HOST, default_runtime, num_hosts  # noqa: E402
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


def remote_word(value: str) -> str:
    """One shell word for a remote command: ``$HOME/...`` (made by the launcher) expands there,
    anything else (``--set`` values: spaces, quotes, ``$``) arrives as written."""
    return expandable(value) if value.startswith("$HOME/") else shlex.quote(value)


def set_words(overrides: list[str], prefix: str = "--set ") -> str:
    """Overrides as words of a remote command (``--set K=V`` for the fleet launcher, or with
    ``prefix="--config."`` for ``sao.main``): launcher-made ``$HOME/...`` paths expand there."""
    out = ""
    for o in overrides:
        lead, word = (prefix, o) if prefix.endswith(" ") else ("", prefix + o)
        out += f" {lead}" + (expandable(word) if o.split("=", 1)[1].startswith("$HOME/") else shlex.quote(word))
    return out


def pid_file(args) -> str:
    return f"$HOME/.sao/fleet-{args.tpu}.pid"


def build(args) -> list[Step]:
    gcloud = ["gcloud", "compute", "tpus", "tpu-vm"]
    where = f"--zone={args.zone}"
    hosts = num_hosts(args.accelerator)
    if args.workdir.startswith("gs://"):  # every machine mounts the bucket; weights travel through it
        bucket, path = bucket_path(args.workdir)
        publish_root = "/".join(p for p in (args.mount, path, "publish") if p)
        fleet_model = args.model or f"{args.mount}/models/base"
        mount = f" && {mount_command(bucket, args.mount)}"
    else:                                 # a file system every machine mounts at this path
        publish_root, fleet_model, mount = f"{args.workdir.rstrip('/')}/publish", args.model, ""
    repo = shlex.quote(args.repo_dir)
    clone = f"(git clone {shlex.quote(args.repo)} {repo} || (cd {repo} && git pull))"
    setup = f"{clone} && cd {repo} && {install.pick_python()} && {install.install_sao('tpu')}{mount}"
    fleet_setup = (f"{clone} && cd {repo} && {install.pick_python()} && {install.install_sao('cpu')} && "
                   f"{install.install_sglang()}{mount}")
    if args.no_install:  # the images have SAO (and SGLang) in --repo_dir already
        setup, fleet_setup = f"cd {repo}{mount}", f"cd {repo}{mount}"
    steps = []
    if not args.existing_tpu:
        delete = Step("local", (*gcloud, "delete", args.tpu, where, "--quiet"))
        steps.append(Step("local", (*gcloud, "create", args.tpu, where, f"--accelerator-type={args.accelerator}",
                                    f"--version={args.runtime}"), at_exit=None if args.keep_tpu else delete))
    steps.append(Step("local", (*gcloud, "ssh", args.tpu, where, "--worker=all", f"--command={setup}")))
    for machine in args.fleet:  # SAO, SGLang (once per machine, in ~/.cache/sao) and the mount
        steps.append(Step("local", ("gcloud", "compute", "ssh", machine, where, f"--command={fleet_setup}")))
    shared = [f"rollout.publish_root={publish_root}", f"model.init={fleet_model}"]
    # Credentials: made here, copied (0600) to each machine before its role starts; paths only.
    learner_files, worker_files = [], []                 # local paths to copy
    learner_set, worker_set = [*shared, *args.set], [*shared, *args.set]  # + the copies' paths
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
    python = remote_word(args.python)
    for machine in args.fleet:
        if worker_files:
            steps += fleet_token.vm_copy_steps(worker_files, machine, args.zone)
        flags = [f"--config={args.config}", f"--workdir={args.workdir}", f"--model={fleet_model}",
                 f"--servers={args.servers_per_machine}", f"--tp={args.tp}", "--host=0.0.0.0",
                 f"--worker_port={args.worker_port}", *shlex.split(args.fleet_args)]
        # Its pid in a file: at exit the launcher stops it there (its workers stop their servers).
        fleet_cmd = (f"cd {repo} && mkdir -p -m 700 $HOME/.sao && echo $$ > {pid_file(args)} && "
                     f"exec {python} launch/sglang_fleet.py " + " ".join(shlex.quote(f) for f in flags)
                     + f" --sglang_python={remote_word(args.sglang_python)}" + set_words(worker_set))
        stop = Step("local", ("gcloud", "compute", "ssh", machine, where,
                              f"--command=kill -TERM $(cat {pid_file(args)}) 2>/dev/null; rm -f {pid_file(args)}; true"))
        steps.append(Step("local", ("gcloud", "compute", "ssh", machine, where, f"--command={fleet_cmd}"),
                          background=True, at_exit=stop))
        addresses += [f"{machine}:{args.worker_port + i}" for i in range(args.servers_per_machine)]
    learner = sao_main(args.config, args.workdir, "learner", python="PYTHON")
    env = (f"JAX_COORDINATOR_ADDRESS={args.tpu}-w-0:{args.coordinator_port} "
           f"JAX_NUM_PROCESSES={hosts} JAX_PROCESS_ID=${{TPU_WORKER_ID:-{WORKER_NUMBER}}}")
    learner_cmd = (f"cd {repo} && {env} exec {python} " + " ".join(shlex.quote(a) for a in learner[1:])
                   + set_words([*learner_set, "rollout.worker_addresses=" + ",".join(addresses)], "--config."))
    steps.append(Step("local", (*gcloud, "ssh", args.tpu, where, "--worker=all", f"--command={learner_cmd}")))
    return steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_flags(parser)
    parser.add_argument("--tpu", default="sao-tpu", help="TPU VM name")
    parser.add_argument("--zone", default="us-east5-a")
    parser.add_argument("--accelerator", default="v5p-64", help="TPU slice type")
    parser.add_argument("--runtime", default="", help="TPU VM software version (default: the "
                        "one for --accelerator's generation, launch/tpu_slice.RUNTIMES)")
    parser.add_argument("--existing_tpu", action="store_true",
                        help="the TPU VM exists: do not create it (nor delete it at the end)")
    parser.add_argument("--keep_tpu", action="store_true",
                        help="do not delete the TPU VM this launch created when the learner ends")
    parser.add_argument("--repo", default="", help="git URL every machine clones SAO from "
                        "(needed unless --no_install)")
    parser.add_argument("--repo_dir", default="sao", help="SAO checkout on every machine (from $HOME)")
    parser.add_argument("--python", default=".venv/bin/python",
                        help="SAO's interpreter on every machine (relative to --repo_dir, or absolute)")
    parser.add_argument("--no_install", action="store_true",
                        help="machines have SAO (and SGLang) in --repo_dir: no clone, no pip")
    parser.add_argument("--fleet", default="", help="comma-separated GPU fleet machine names")
    parser.add_argument("--servers_per_machine", type=int, default=8, help="SGLang servers per fleet machine")
    parser.add_argument("--tp", type=int, default=1, help="GPUs per SGLang server (tensor parallel)")
    parser.add_argument("--fleet_args", default="",
                        help="more launch/sglang_fleet.py flags, one quoted string (e.g. '--device=cpu')")
    parser.add_argument("--sglang_python", default=SGLANG_PYTHON, help="SGLang's interpreter on the fleet")
    parser.add_argument("--model", "--fleet_model", dest="model", default="",
                        help="base model's HF dir as every machine sees it (model.init of the "
                        "learner and the workers; default <mount>/models/base for a gs:// workdir)")
    parser.add_argument("--mount", default=DEFAULT_MOUNT,
                        help="where every machine mounts the work dir's bucket (gcsfuse)")
    parser.add_argument("--coordinator_port", type=int, default=COORDINATOR_PORT)
    parser.add_argument("--worker_port", type=int, default=WORKER_PORT, help="port of worker 0 per machine")
    parser.add_argument("--token_dir", default="", help="local directory of the run's token file "
                        "(default ~/.sao/<tpu>; reused on a relaunch)")
    parser.add_argument("--tls_cert", default="", help="local PEM certificate the workers serve with")
    parser.add_argument("--tls_key", default="", help="local PEM private key of --tls_cert")
    parser.add_argument("--tls_ca", default="", help="local PEM CA (or the self-signed --tls_cert) "
                        "the learner verifies workers with")
    args = parser.parse_args(argv)
    args.fleet = [m for m in args.fleet.split(",") if m]
    if args.workdir.startswith("gs://"):
        try:
            bucket_path(args.workdir)
        except ValueError as e:
            parser.error(str(e))
    elif not os.path.isabs(args.workdir) or not args.model:
        parser.error(f"--workdir must be gs://BUCKET/... (every machine mounts the bucket) or an absolute "
                     f"path every machine mounts, with --model; got {args.workdir!r}")
    if not args.fleet:
        parser.error("--fleet is empty: name the GPU machines of the rollout fleet (--fleet=f0,f1)")
    if args.servers_per_machine < 1 or args.tp < 1:
        parser.error("--servers_per_machine and --tp must be >= 1")
    try:
        num_hosts(args.accelerator)
    except ValueError as e:
        parser.error(str(e))
    if not args.runtime:
        try:
            args.runtime = default_runtime(args.accelerator)
        except ValueError as e:
            parser.error(str(e))
    check_config(args)
    chips = num_hosts(args.accelerator) * CHIPS_PER_HOST
    learner_mesh(args.config, args.set, chips, f"{args.accelerator} ({chips} chips)")
    if not args.repo and not args.no_install:
        if not args.dry_run:
            parser.error("--repo: the git URL every machine clones SAO from (or --no_install when "
                         "--repo_dir already holds SAO on every machine)")
        args.repo = "<--repo URL>"
    if not args.dry_run:
        print_locations(args.workdir)
    return dry_run_or_run(build(args), args.dry_run, stop_background=True)


if __name__ == "__main__":
    sys.exit(main())
