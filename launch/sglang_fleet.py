"""SGLang rollout fleet on one machine: N rollout workers, each starting and supervising its own SGLang server; optionally the learner too.

    python launch/sglang_fleet.py --config=experiments/sao_math.py:qwen3_8b \\
        --workdir=/shared/runs/sao_math --model=/models/qwen3-8b --servers=4 --gpus=8 --learner --dry-run

Worker ``i`` is ``sao.main --role=rollout`` on port ``worker_port + i`` with
``model.init=--model`` (its tokenizer) and the server command in
``rollout.sglang`` (docs/rollout.md, "Workers and their servers"): ``python -m
sglang.launch_server`` (``--backend=torch``: GPU ``i * tp`` on,
``--device=cpu``: SGLang's CPU engine) or ``sgl_jax.launch_server``
(``--backend=jax``: TPU / GPU, or ``--device=cpu``, at niceness 10) on port ``sglang_port +
i``, plus ``--server_args``. The worker starts its server with the learner's
first weights (the HF export of each publish) and reloads it on every push:
``/update_weights_from_disk`` (SGLang) or a restart (sglang-jax, which has no
such endpoint); it stops the server when it exits. With ``--learner`` the
learner (``sao.main --role=learner``, ``rollout.worker_addresses`` = these
workers) runs in the foreground and the workers are stopped when it ends;
without it the workers serve until stopped (SIGTERM or SIGHUP: each stops its
server), for a learner elsewhere. ``--tp N`` gives each server N GPUs;
servers x TP (plus one GPU for ``--learner``, which gets the GPUs the servers
leave through ``CUDA_VISIBLE_DEVICES``) must fit ``--gpus`` (default: the
GPUs this machine shows), or the launch is refused before it starts
anything; workers keep their own JAX on the CPU. ``--attach URL,...`` starts
one worker per SGLang server already running (``--sglang_url``; it reloads
from the run's publish directory, which it must read). The run's token file
(``<workdir>/fleet.token``) is created first unless ``rollout.token_file`` is
set (``--set``). ``--backend=torch --device=cpu`` puts SAO's ``sgl_kernel``
stand-in on the servers' ``PYTHONPATH`` (``sao/rollout/sgl_kernel_cpu``).
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from launch import venv_check
    venv_check.ensure()
from launch import fleet_token  # noqa: E402
from launch.common import (Step, add_common_flags, check_config, dry_run_or_run, print_locations,  # noqa: E402
                           sao_main)
from launch.mesh_check import learner_mesh  # noqa: E402
from sao.rollout.sglang_server import JAX_CPU_ARGS, SGL_KERNEL_CPU_PATH, TORCH_CPU_ARGS  # noqa: E402

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
    """Config overrides every process of the fleet gets (the model and the engine; ``--set`` last, so it wins)."""
    return ["rollout.engine=sglang", f"model.init={args.model}", *args.set]


def worker_overrides(args, i: int) -> list[str]:
    if args.attach:  # attach: no server command (rollout.sglang.python empty), the URL as a flag
        return [*fleet_overrides(args), "rollout.sglang.python="]
    # sglang-jax's idle scheduler polls in a loop (~0.8 core per CPU server): niced, it
    # yields those cycles to the learner and workers on the same machine (--set wins).
    niced = ["rollout.sglang.nice=10"] if args.backend == "jax" and args.device == "cpu" else []
    out = [*niced, *fleet_overrides(args), f"rollout.sglang.python={args.sglang_python}",
           f"rollout.sglang.module={SERVER_MODULES[args.backend]}",
           f"rollout.sglang.args={shlex.join(server_args(args, i))}",
           f"rollout.sglang.port={args.sglang_port}"]
    if args.server_env:
        out.append(f"rollout.sglang.env={args.server_env}")
    python_path = args.server_python_path
    if args.backend == "torch" and args.device == "cpu":  # SGLang's CPU engine: the sgl_kernel stand-in
        python_path = os.pathsep.join(filter(None, [python_path, SGL_KERNEL_CPU_PATH]))
    if python_path:
        out.append(f"rollout.sglang.python_path={python_path}")
    if args.reload:
        out.append(f"rollout.sglang.reload={args.reload}")
    return out


def build(args) -> list[Step]:
    steps = []
    if not fleet_token.configured(args.set, "rollout.token_file"):  # <workdir>/fleet.token
        steps.append(fleet_token.create_step(args.workdir, args.python))
    addresses = []
    # A worker only talks HTTP to its server: its own JAX stays on the CPU (on a GPU machine
    # it would otherwise take most of a GPU's memory, which the servers and the learner need).
    worker_env = (("JAX_PLATFORMS", "cpu"),)
    for i in range(args.servers):
        extra = [f"--port={args.worker_port + i}", f"--host={args.host}", f"--worker_index={i}"]
        if args.attach:
            extra.append(f"--sglang_url={args.attach[i]}")
        worker = sao_main(args.config, args.workdir, "rollout", python=args.python,
                          overrides=worker_overrides(args, i), extra=extra)
        steps.append(Step(f"worker{i}", worker, background=True, env=worker_env))
        addresses.append(f"127.0.0.1:{args.worker_port + i}")
    if args.learner:
        learner = sao_main(args.config, args.workdir, "learner", python=args.python,
                           overrides=[*fleet_overrides(args),
                                      "rollout.worker_addresses=" + ",".join(addresses)])
        env = ()
        if args.device == "gpu" and not args.attach:  # the GPUs the servers leave
            env = (("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(args.servers * args.tp, args.gpus)))),)
        steps.append(Step("learner", learner, env=env))
    return steps


def visible_gpus() -> int:
    """GPUs of this machine: ``CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi -L`` lines, else 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def check_fit(args, parser) -> None:
    """Refuses (before anything starts) a fleet whose servers x TP, plus the learner, exceed the GPUs."""
    if args.attach or args.device != "gpu":
        return
    if args.gpus is None:
        args.gpus = visible_gpus()
    need = args.servers * args.tp + (1 if args.learner else 0)
    if need > args.gpus:
        parser.error(f"{args.servers} servers x --tp {args.tp}"
                     + (" + the learner" if args.learner else "")
                     + f" need {need} GPUs; {args.gpus} here (--gpus to say how many; "
                     "fewer --servers, a smaller --tp, or the learner elsewhere)")
    if args.learner:
        rest = args.gpus - args.servers * args.tp
        learner_mesh(args.config, fleet_overrides(args), rest, f"the {rest} GPUs the servers leave")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_flags(parser)
    parser.add_argument("--model", required=True,
                        help="HF model directory: the policy's start (model.init) and tokenizer")
    parser.add_argument("--servers", type=int, default=None,
                        help="workers, one SGLang server each (default 8; with --attach one per URL)")
    parser.add_argument("--tp", type=int, default=1, help="GPUs per server (tensor parallel)")
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs of this machine (default: CUDA_VISIBLE_DEVICES or nvidia-smi)")
    parser.add_argument("--attach", default="",
                        help="URL,... of SGLang servers already running: one worker each, no server "
                        "started; they must read the run's publish dir (reload from disk)")
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
    args.attach = [u for u in args.attach.split(",") if u]
    if args.attach and args.servers not in (None, len(args.attach)):
        parser.error(f"--servers={args.servers} but --attach lists {len(args.attach)} URLs")
    args.servers = len(args.attach) if args.attach else (8 if args.servers is None else args.servers)
    if args.servers < 1 or args.tp < 1:
        parser.error("--servers and --tp must be >= 1")
    check_config(args)
    check_fit(args, parser)
    if not args.dry_run:
        print_locations(args.workdir)
    return dry_run_or_run(build(args), args.dry_run, stop_background=args.learner)


if __name__ == "__main__":
    sys.exit(main())
