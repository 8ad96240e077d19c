"""SGLang rollout fleet on one machine: N rollout workers, each starting and supervising its own SGLang server; optionally the learner too.

    python launch/sglang_fleet.py --config=experiments/sao_math.py:qwen3_8b \\
        --workdir=/shared/runs/sao_math --model=/models/qwen3-8b --servers=8 --learner --dry-run

Worker ``i`` is ``sao.main --role=rollout`` on port ``worker_port + i`` with
``model.init=--model`` (its tokenizer) and the server command in
``rollout.sglang`` (docs/rollout.md, "Workers and their servers"): ``python -m
sglang.launch_server`` (``--backend=torch``: GPU ``i * tp`` on,
``--device=cpu``: SGLang's CPU engine) or ``sgl_jax.launch_server``
(``--backend=jax``: TPU / GPU, or ``--device=cpu``) on port ``sglang_port +
i``, plus ``--server_args``. The worker starts its server with the learner's
first weights (the HF export of each publish) and reloads it on every push:
``/update_weights_from_disk`` (SGLang) or a restart (sglang-jax, which has no
such endpoint); it stops the server when it exits. With ``--learner`` the
learner (``sao.main --role=learner``, ``rollout.worker_addresses`` = these
workers) runs in the foreground and the workers are stopped when it ends;
without it the workers serve until stopped, for a learner elsewhere. The run's
token file (``<workdir>/fleet.token``) is created first unless
``rollout.token_file`` is set (``--set``).
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launch import fleet_token  # noqa: E402
from launch.common import Step, add_common_flags, check_config, dry_run_or_run, sao_main  # noqa: E402
from sao.rollout.sglang_server import JAX_CPU_ARGS, TORCH_CPU_ARGS  # noqa: E402

SERVER_MODULES = {"torch": "sglang.launch_server", "jax": "sgl_jax.launch_server"}


def server_args(args, i: int) -> tuple[str, ...]:
    """Launch flags of worker ``i``'s server (after ``--model-path`` / host / port)."""
    if args.device == "cpu":
        argv = list(JAX_CPU_ARGS if args.backend == "jax" else TORCH_CPU_ARGS)
    else:
        argv = ["--tp", str(args.tp), "--mem-fraction-static", str(args.mem_fraction)]
        if args.backend == "torch":
            argv += ["--base-gpu-id", str(i * args.tp)]
    if args.backend == "jax":
        # sglang-jax's overlap scheduler returned wrong log-probs under load
        # in our CPU server test (docs/rollout.md); DIS needs exact ones.
        argv += ["--disable-overlap-schedule"]
    return tuple(argv) + tuple(shlex.split(args.server_args))


def fleet_overrides(args) -> list[str]:
    """Config overrides every process of the fleet gets (the model and the engine)."""
    return [*args.set, "rollout.engine=sglang", f"model.init={args.model}"]


def worker_overrides(args, i: int) -> list[str]:
    out = [*fleet_overrides(args), f"rollout.sglang.python={args.sglang_python}",
           f"rollout.sglang.module={SERVER_MODULES[args.backend]}",
           f"rollout.sglang.args={shlex.join(server_args(args, i))}",
           f"rollout.sglang.port={args.sglang_port}"]
    if args.server_env:
        out.append(f"rollout.sglang.env={args.server_env}")
    if args.server_python_path:
        out.append(f"rollout.sglang.python_path={args.server_python_path}")
    if args.reload:
        out.append(f"rollout.sglang.reload={args.reload}")
    return out


def build(args) -> list[Step]:
    steps = []
    if not fleet_token.configured(args.set, "rollout.token_file"):  # <workdir>/fleet.token
        steps.append(fleet_token.create_step(args.workdir, args.python))
    addresses = []
    for i in range(args.servers):
        worker = sao_main(args.config, args.workdir, "rollout", python=args.python,
                          overrides=worker_overrides(args, i),
                          extra=(f"--port={args.worker_port + i}", f"--host={args.host}",
                                 f"--worker_index={i}"))
        steps.append(Step(f"worker{i}", worker, background=True))
        addresses.append(f"127.0.0.1:{args.worker_port + i}")
    if args.learner:
        learner = sao_main(args.config, args.workdir, "learner", python=args.python,
                           overrides=[*fleet_overrides(args),
                                      "rollout.worker_addresses=" + ",".join(addresses)])
        steps.append(Step("learner", learner))
    return steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_flags(parser)
    parser.add_argument("--model", required=True,
                        help="HF model directory: the policy's start (model.init) and tokenizer")
    parser.add_argument("--servers", type=int, default=8, help="workers (one SGLang server each)")
    parser.add_argument("--tp", type=int, default=1, help="GPUs per server (tensor parallel)")
    parser.add_argument("--backend", choices=sorted(SERVER_MODULES), default="torch")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                        help="cpu: the backend's CPU flags (sglang_server.JAX_CPU_ARGS / TORCH_CPU_ARGS)")
    parser.add_argument("--server_args", default="", help="extra server flags (one quoted string)")
    parser.add_argument("--server_env", default="", help='extra server environment, "K=V K2=V2"')
    parser.add_argument("--server_python_path", default="",
                        help="directories put first on the servers' PYTHONPATH (':'-separated)")
    parser.add_argument("--reload", choices=("", "update_weights_from_disk", "restart"), default="",
                        help="how servers load pushed weights (default: restart for jax, else the endpoint)")
    parser.add_argument("--sglang_python", default="python", help="interpreter with SGLang installed")
    parser.add_argument("--python", default=sys.executable, help="interpreter with SAO installed")
    parser.add_argument("--sglang_port", type=int, default=30000, help="port of server 0")
    parser.add_argument("--worker_port", type=int, default=50151, help="port of worker 0")
    parser.add_argument("--host", default="127.0.0.1", help="bind address of the rollout workers")
    parser.add_argument("--mem_fraction", type=float, default=0.85, help="SGLang --mem-fraction-static (GPU)")
    parser.add_argument("--learner", action="store_true",
                        help="also run the learner here (foreground); the workers stop when it ends")
    args = parser.parse_args(argv)
    if args.servers < 1 or args.tp < 1:
        parser.error("--servers and --tp must be >= 1")
    check_config(args)
    return dry_run_or_run(build(args), args.dry_run, stop_background=args.learner)


if __name__ == "__main__":
    sys.exit(main())
