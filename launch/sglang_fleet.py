"""SGLang rollout fleet on one machine: N SGLang servers (one per GPU) + one SAO rollout worker each.

    python launch/sglang_fleet.py --config=experiments/sao_math.py:qwen3_30b_a3b \
        --workdir=gs://BUCKET/sao_math --model=/models/qwen3-30b-a3b --servers=8 --dry-run

Server ``i`` is ``python -m sglang.launch_server`` on GPU ``i`` at port
``sglang_port + i`` (``--backend=jax``: ``sgl_jax.launch_server`` for TPU / CPU);
its worker is ``sao.main --role=rollout`` at port ``worker_port + i`` with
``--sglang_url`` pointing at it. The learner connects to the workers
(``rollout.worker_addresses``) and pushes weights as HF exports, which the
workers load into their server (``/update_weights_from_disk``).
"""
from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launch.common import Step, add_common_flags, dry_run_or_run, sao_main  # noqa: E402

SERVER_MODULES = {"torch": "sglang.launch_server", "jax": "sgl_jax.launch_server"}


def server_argv(args, i: int) -> tuple[str, ...]:
    argv = [args.sglang_python, "-m", SERVER_MODULES[args.backend], "--model-path", args.model,
            "--host", "127.0.0.1", "--port", str(args.sglang_port + i), "--skip-tokenizer-init",
            "--mem-fraction-static", str(args.mem_fraction), "--tp", str(args.tp)]
    if args.backend == "torch":
        argv += ["--base-gpu-id", str(i * args.tp)]
    else:
        # sglang-jax's overlap scheduler returned wrong log-probs under load
        # in our CPU server test (docs/rollout.md); DIS needs exact ones.
        argv += ["--disable-overlap-schedule"]
    return tuple(argv)


def build(args) -> list[Step]:
    steps = []
    for i in range(args.servers):
        steps.append(Step(f"server{i}", server_argv(args, i), background=True))
        url = f"http://127.0.0.1:{args.sglang_port + i}"
        worker = sao_main(args.config, args.workdir, "rollout", python=args.python,
                          overrides=[*args.set, "rollout.engine=sglang"],
                          extra=(f"--port={args.worker_port + i}", f"--host={args.host}",
                                 f"--sglang_url={url}", f"--worker_index={i}"))
        steps.append(Step(f"worker{i}", worker, background=True))
    return steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_flags(parser)
    parser.add_argument("--model", required=True, help="HF model directory served at start")
    parser.add_argument("--servers", type=int, default=8, help="SGLang servers on this machine")
    parser.add_argument("--tp", type=int, default=1, help="GPUs per server (tensor parallel)")
    parser.add_argument("--backend", choices=sorted(SERVER_MODULES), default="torch")
    parser.add_argument("--sglang_python", default="python", help="interpreter with SGLang installed")
    parser.add_argument("--python", default=sys.executable, help="interpreter with SAO installed")
    parser.add_argument("--sglang_port", type=int, default=30000)
    parser.add_argument("--worker_port", type=int, default=50151)
    parser.add_argument("--host", default="127.0.0.1", help="bind address of the rollout workers")
    parser.add_argument("--mem_fraction", type=float, default=0.85, help="SGLang --mem-fraction-static")
    args = parser.parse_args(argv)
    if args.servers < 1 or args.tp < 1:
        parser.error("--servers and --tp must be >= 1")
    return dry_run_or_run(build(args), args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
