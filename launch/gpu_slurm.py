"""GPU cluster launch with Slurm: writes (and submits) an sbatch script for the learner and the fleet.

    python launch/gpu_slurm.py --config=experiments/sao_math.py:qwen3_30b_a3b \
        --workdir=/shared/runs/sao_math --learner_nodes=4 --fleet_nodes=4 --dry-run

One heterogeneous job: component 0 runs the learner on ``learner_nodes`` nodes
(one ``sao.main --role=learner`` process per node, joined by
``jax.distributed.initialize`` through ``JAX_COORDINATOR_ADDRESS`` = first
learner node, ``JAX_NUM_PROCESSES`` = ``SLURM_NNODES``, ``JAX_PROCESS_ID`` =
``SLURM_PROCID``); component 1 runs ``launch/sglang_fleet.py`` on each fleet
node (rollout workers, each starting its own SGLang server with
``--sglang_python``; ``make venv sglang-real-venv`` in ``--repo_dir`` once
per machine, or once for a shared ``$HOME``). ``--repo_dir`` and
``--sglang_python`` may use ``$HOME``: the script expands it. The run's token file is created in
the shared workdir before ``sbatch`` (``launch/fleet_token.py``) and every role
gets its path (``rollout.token_file``), as it gets every ``--set``. ``--dry-run``
prints the script and the commands instead of running them.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launch import fleet_token  # noqa: E402
from launch.common import (Step, add_common_flags, check_config, expandable, print_steps, run_steps,  # noqa: E402
                           sao_main)
from launch.mesh_check import learner_mesh  # noqa: E402

COORDINATOR_PORT = 8476
WORKER_PORT = 50151


def token_file(args) -> str:
    """``--set rollout.token_file=...`` if given, else ``<workdir>/fleet.token`` (shared file system)."""
    return (fleet_token.configured(args.set, "rollout.token_file")
            or fleet_token.token_path(args.workdir))


def sbatch_script(args) -> str:
    """The sbatch script text (bash)."""
    overrides = [*args.set, f"rollout.token_file={token_file(args)}"]
    fleet = (f"python launch/sglang_fleet.py --config={shlex.quote(args.config)} "
             f"--workdir={shlex.quote(args.workdir)} --model={shlex.quote(args.fleet_model)} "
             f"--servers={args.gpus_per_node} --host=0.0.0.0 "
             f"--sglang_python={expandable(args.sglang_python)}"
             + "".join(f" --set {shlex.quote(o)}" for o in overrides))
    learner = " ".join(shlex.quote(a) for a in sao_main(args.config, args.workdir, "learner",
                                                        overrides=overrides))
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name={args.job_name}",
        f"#SBATCH --time={args.time}",
        f"#SBATCH --nodes={args.learner_nodes} --gpus-per-node={args.gpus_per_node} --ntasks-per-node=1",
        f"#SBATCH --output={args.workdir}/slurm-%j.out",
        "#SBATCH hetjob",
        f"#SBATCH --nodes={args.fleet_nodes} --gpus-per-node={args.gpus_per_node} --ntasks-per-node=1",
        "set -euo pipefail",
        f"cd {expandable(args.repo_dir)} && source .venv/bin/activate",  # $HOME expands
        "FLEET_NODES=$(scontrol show hostnames \"$SLURM_JOB_NODELIST_HET_GROUP_1\")",
        f"WORKERS=$(for h in $FLEET_NODES; do for i in $(seq 0 {args.gpus_per_node - 1}); do "
        f"printf '%s:%d,' $h $(({WORKER_PORT}+i)); done; done | sed 's/,$//')",
        "COORD=$(scontrol show hostnames \"$SLURM_JOB_NODELIST_HET_GROUP_0\" | head -n1)",
        f"srun --het-group=1 bash -c {shlex.quote(fleet)} &",
        f"srun --het-group=0 bash -c 'JAX_COORDINATOR_ADDRESS='$COORD':{COORDINATOR_PORT} "
        "JAX_NUM_PROCESSES=$SLURM_NNODES JAX_PROCESS_ID=$SLURM_PROCID "
        f"{learner} --config.rollout.worker_addresses='$WORKERS",
        "wait",
        "",
    ])


def build(args) -> tuple[str, list[Step]]:
    script_path = f"{args.workdir}/sao.sbatch"
    steps = [Step("local", ("mkdir", "-p", args.workdir))]
    if not fleet_token.configured(args.set, "rollout.token_file"):
        steps.append(fleet_token.create_step(args.workdir, sys.executable))
    return script_path, steps + [Step("local", ("sbatch", script_path))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_flags(parser)
    parser.add_argument("--learner_nodes", type=int, default=4)
    parser.add_argument("--fleet_nodes", type=int, default=4)
    parser.add_argument("--gpus_per_node", type=int, default=8)
    parser.add_argument("--time", default="48:00:00", help="Slurm time limit")
    parser.add_argument("--job_name", default="sao")
    parser.add_argument("--repo_dir", default="$HOME/sao", help="SAO checkout on the cluster")
    parser.add_argument("--fleet_model", default="/shared/models/base",
                        help="HF dir the fleet's workers start from (their model.init)")
    parser.add_argument("--sglang_python", default="$HOME/.cache/sao/sglang-0.5.23/bin/python",
                        help="SGLang's interpreter on the fleet nodes (`make sglang-real-venv` "
                        "installs it there once per machine)")
    args = parser.parse_args(argv)
    if min(args.learner_nodes, args.fleet_nodes, args.gpus_per_node) < 1:
        parser.error("node and GPU counts must be >= 1")
    check_config(args)
    gpus = args.learner_nodes * args.gpus_per_node
    learner_mesh(args.config, args.set, gpus,
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
    return run_steps(steps[1:])


if __name__ == "__main__":
    sys.exit(main())
