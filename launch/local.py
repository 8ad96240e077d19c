"""Local multi-process launch: N rollout worker processes + one learner, over gRPC on 127.0.0.1.

    python launch/local.py --config=experiments/quickstart.py --workdir=runs/qs --workers=2 --dry-run

Each worker is ``python -m sao.main --role=rollout`` on its own port; the
learner is ``--role=learner`` with ``rollout.worker_addresses`` set to them.
(``--role=all`` does the same inside one command: ``sao.workers.local_fleet``.)
The run's token file is created first (``launch/fleet_token.py``): workers
started before the learner read it.
"""
from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from launch import venv_check
    venv_check.ensure()
from launch import fleet_token  # noqa: E402
from launch.common import Step, add_common_flags, check_config, dry_run_or_run, sao_main  # noqa: E402


def build(args) -> list[Step]:
    ports = [args.base_port + i for i in range(args.workers)]
    steps, overrides = [], list(args.set)
    if not fleet_token.configured(args.set, "rollout.token_file"):
        steps.append(fleet_token.create_step(args.workdir, args.python))
        overrides.append(f"rollout.token_file={fleet_token.token_path(args.workdir)}")
    steps += [Step(f"worker{i}", sao_main(args.config, args.workdir, "rollout", python=args.python,
                                          overrides=overrides, extra=(f"--port={p}", f"--worker_index={i}")),
                   background=True)
              for i, p in enumerate(ports)]
    addresses = ",".join(f"127.0.0.1:{p}" for p in ports)
    steps.append(Step("learner", sao_main(args.config, args.workdir, "learner", python=args.python,
                                          overrides=[*overrides, f"rollout.worker_addresses={addresses}"])))
    return steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_flags(parser)
    parser.add_argument("--workers", type=int, default=2, help="rollout worker processes")
    parser.add_argument("--base_port", type=int, default=50151, help="port of worker 0")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the processes")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    check_config(args)
    return dry_run_or_run(build(args), args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
