"""GPU cluster launch with Slurm: writes (and submits) an sbatch script for the learner and the fleet.

    python launch/gpu_slurm.py --config=experiments/sao_math.py:qwen3_30b_a3b \\
        --workdir=/shared/runs/sao_math --model=/shared/models/qwen3-30b-a3b \\
        --learner_nodes=4 --fleet_nodes=4 --dry-run

One heterogeneous job: component 0 runs the learner on ``learner_nodes`` nodes
(one ``sao.main --role=learner`` process per node, joined by
``jax.distributed.initialize`` through ``JAX_COORDINATOR_ADDRESS`` = first
learner node, ``JAX_NUM_PROCESSES`` = the step's nodes, ``JAX_PROCESS_ID`` =
``SLURM_PROCID``; ``--kill-on-bad-exit``: one process failing ends the
others); component 1 runs ``launch/sglang_fleet.py`` on each fleet node
(``--servers_per_node`` rollout workers, each starting its own SGLang server
on ``--tp`` GPUs). With ``--attach URL,...`` there is no fleet component: one
worker per running SGLang server, on the first learner node. Every role
starts from ``--model`` (``model.init``) and gets every ``--set`` verbatim.

The job ends with the learner: its exit status is the job's, and the fleet is
stopped then (SIGTERM: workers stop their servers), so a finished or failed
run frees its nodes. Unless ``--no_install``, the script first installs SAO
in ``--repo_dir`` with ``jax[cuda12]`` and, for a fleet, the SGLang server
(``launch/install.py``; once for a shared ``$HOME``, it reuses what is there).
``--repo_dir``, ``--python`` and ``--sglang_python`` may use ``$HOME``: the
script expands it. The run's token file is created in the shared workdir
before ``sbatch`` (``launch/fleet_token.py``) and every role gets its path
(``rollout.token_file``). Refused before anything is written or submitted:
a config that does not load, a learner mesh that does not fit the learner's
GPUs, servers x TP above the GPUs of a node. ``--dry-run`` prints the
script and the commands; ``--wait`` waits for the job and exits with its
status. ``launch/localcluster`` runs the script on one machine (tests).
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
from launch.common import (Step, add_common_flags, check_config, expandable, print_locations,  # noqa: E402
                           print_steps, run_steps, sao_main)
from launch.mesh_check import learner_mesh  # noqa: E402


def token_file(args) -> str:
    """``--set rollout.token_file=...`` if given, else ``<workdir>/fleet.token`` (shared file system)."""
    return (fleet_token.configured(args.set, "rollout.token_file")
            or fleet_token.token_path(args.workdir))


def overrides(args) -> list[str]:
    """Every role's config overrides: the model, the token, then ``--set`` (which wins)."""
    token = [] if fleet_token.configured(args.set, "rollout.token_file") else \
        [f"rollout.token_file={token_file(args)}"]
    return [f"model.init={args.model}", *token, *args.set]


def learner_command(args) -> str:
    """One learner process (``bash -c`` text): JAX's variables from the step, addresses from the script."""
    argv = sao_main(args.config, args.workdir, "learner", python="PYTHON", overrides=overrides(args))
    return ('exec env JAX_COORDINATOR_ADDRESS="$SAO_COORDINATOR" JAX_NUM_PROCESSES="$SLURM_STEP_NUM_NODES" '
            f'JAX_PROCESS_ID="$SLURM_PROCID" {expandable(args.python)} '
            + " ".join(shlex.quote(a) for a in argv[1:])
            + ' "--config.rollout.worker_addresses=$SAO_WORKERS"')


def fleet_command(args, *, host: str) -> str:
    """``launch/sglang_fleet.py`` on one fleet node (or, attached, on the first learner node)."""
    words = [f"--config={args.config}", f"--workdir={args.workdir}", f"--model={args.model}",
             f"--host={host}", f"--worker_port={args.worker_port}"]
    if args.attach:
        words.append(f"--attach={','.join(args.attach)}")
    else:
        words += [f"--servers={args.servers_per_node}", f"--tp={args.tp}", f"--gpus={args.gpus_per_node}",
                  f"--backend={args.backend}", f"--sglang_port={args.sglang_port}"]
    words += shlex.split(args.fleet_args)
    for o in overrides(args)[1:]:  # model.init: from --model
        words += ["--set", o]
    text = f"exec {expandable(args.python)} launch/sglang_fleet.py " + " ".join(shlex.quote(w) for w in words)
    if not args.attach:
        text += f" --sglang_python={expandable(args.sglang_python)}"
    return text


def sbatch_script(args) -> str:
    """The sbatch script text (bash)."""
    gpus = f"--gpus-per-node={args.gpus_per_node} --ntasks-per-node=1"
    head = ["#!/bin/bash", f"#SBATCH --job-name={args.job_name}", f"#SBATCH --time={args.time}",
            f"#SBATCH --nodes={args.learner_nodes} {gpus}", f"#SBATCH --output={args.workdir}/slurm-%j.out"]
    if not args.attach:
        head += ["#SBATCH hetjob", f"#SBATCH --nodes={args.fleet_nodes} {gpus}"]
    body = ["set -euo pipefail", f"cd {expandable(args.repo_dir)}"]  # $HOME expands
    if not args.no_install:
        body += [install.pick_python(), install.install_sao("gpu")]
        if not args.attach and args.backend == "torch":
            body.append(f"[ -x {expandable(args.sglang_python)} ] || {install.install_sglang()}")
    w = args.workdir.rstrip("/")
    body.append(f"echo {shlex.quote(f'SAO run {w}: metrics {w}/metrics.jsonl, TensorBoard {w}/tb, checkpoints {w}/ckpt, worker logs {w}/workers')}")
    body.append('export SAO_COORDINATOR="$(scontrol show hostnames "${SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}" '
                f'| head -n1):{args.coordinator_port}"')
    if args.attach:
        body.append("export SAO_WORKERS=" + ",".join(f"127.0.0.1:{args.worker_port + i}"
                                                      for i in range(len(args.attach))))
        body.append(f"bash -c {shlex.quote(fleet_command(args, host='127.0.0.1'))} &")
    else:
        body.append('FLEET_NODES=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_1")')
        body.append(f"export SAO_WORKERS=$(for h in $FLEET_NODES; do for i in $(seq 0 {args.servers_per_node - 1}); "
                    f"do printf '%s:%d,' $h $(({args.worker_port}+i)); done; done | sed 's/,$//')")
        body.append(f"srun --het-group=1 bash -c {shlex.quote(fleet_command(args, host='0.0.0.0'))} &")
    learner_group = "" if args.attach else "--het-group=0 "
    body += ["FLEET_PID=$!", "status=0",
             f"srun {learner_group}--kill-on-bad-exit=1 bash -c {shlex.quote(learner_command(args))} || status=$?",
             "# The learner is done: stop the fleet (its workers stop their servers) and free the nodes.",
             'kill -TERM "$FLEET_PID" 2>/dev/null || true', 'wait "$FLEET_PID" || true',
             'echo "learner exit status $status"', 'exit "$status"', ""]
    return "\n".join(head + body)


def build(args) -> tuple[str, list[Step]]:
    script_path = f"{args.workdir}/sao.sbatch"
    steps = [Step("local", ("mkdir", "-p", args.workdir))]
    if not fleet_token.configured(args.set, "rollout.token_file"):
        steps.append(fleet_token.create_step(args.workdir, sys.executable))
    return script_path, steps + [Step("local", ("sbatch", *(("--wait",) if args.wait else ()), script_path))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_flags(parser)
    parser.add_argument("--model", "--fleet_model", dest="model", default="/shared/models/base",
                        help="HF dir every role starts from (model.init) on the shared file system")
    parser.add_argument("--learner_nodes", type=int, default=4)
    parser.add_argument("--fleet_nodes", type=int, default=4)
    parser.add_argument("--gpus_per_node", type=int, default=8)
    parser.add_argument("--tp", type=int, default=1, help="GPUs per SGLang server (tensor parallel)")
    parser.add_argument("--servers_per_node", type=int, default=None,
                        help="SGLang servers per fleet node (default gpus_per_node // tp)")
    parser.add_argument("--backend", choices=("torch", "jax"), default="torch", help="SGLang or sglang-jax")
    parser.add_argument("--attach", default="", help="URL,... of SGLang servers already running (no fleet "
                        "nodes; they must read the shared workdir's publish dir)")
    parser.add_argument("--fleet_args", default="",
                        help="more launch/sglang_fleet.py flags, one quoted string (e.g. '--device=cpu')")
    parser.add_argument("--time", default="48:00:00", help="Slurm time limit")
    parser.add_argument("--job_name", default="sao")
    parser.add_argument("--repo_dir", default="$HOME/sao", help="SAO checkout on the cluster")
    parser.add_argument("--python", default=".venv/bin/python",
                        help="SAO's interpreter on the nodes (relative to --repo_dir, or absolute)")
    parser.add_argument("--no_install", action="store_true",
                        help="use the environments in --repo_dir as they are (no pip, no make)")
    parser.add_argument("--sglang_python", default="$HOME/.cache/sao/sglang-0.5.23/bin/python",
                        help="SGLang's interpreter on the fleet nodes (`make sglang-real-venv` installs it)")
    parser.add_argument("--coordinator_port", type=int, default=8476)
    parser.add_argument("--worker_port", type=int, default=50151, help="port of worker 0 on each fleet node")
    parser.add_argument("--sglang_port", type=int, default=30000, help="port of server 0 on each fleet node")
    parser.add_argument("--wait", action="store_true", help="wait for the job; exit with its status")
    args = parser.parse_args(argv)
    args.attach = [u for u in args.attach.split(",") if u]
    if min(args.learner_nodes, args.fleet_nodes, args.gpus_per_node, args.tp) < 1:
        parser.error("node, GPU and --tp counts must be >= 1")
    if args.servers_per_node is None:
        args.servers_per_node = max(1, args.gpus_per_node // args.tp)
    if not args.attach and args.servers_per_node * args.tp > args.gpus_per_node:
        parser.error(f"{args.servers_per_node} servers x --tp {args.tp} need "
                     f"{args.servers_per_node * args.tp} GPUs; a fleet node has {args.gpus_per_node}")
    check_config(args)
    gpus = args.learner_nodes * args.gpus_per_node
    learner_mesh(args.config, [f"model.init={args.model}", *args.set], gpus,
                 f"{args.learner_nodes} learner nodes x {args.gpus_per_node} GPUs")
    script = sbatch_script(args)
    path, steps = build(args)
    if args.dry_run:
        print(f"# {path}")
        print(script)
        print_steps(steps)
        return 0
    os.makedirs(args.workdir, exist_ok=True)
    with open(path, "w") as f:
        f.write(script)
    print_locations(args.workdir)
    log = f"{args.workdir}/slurm-JOBID.out (JOBID: the number in sbatch's line below)"
    print(f"Slurm log, the learner's and the workers' output: {log}", file=sys.stderr)
    status = run_steps(steps[1:])
    if args.wait:
        print(f"the job ended with exit status {status}; its output: {log}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
