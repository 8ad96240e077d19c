"""Shared pieces of the cluster-in-a-box tests: a box per test, free ports, the tiny model, the servers."""
from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from launch.localcluster import box  # noqa: E402

SHIMS = ROOT / "launch" / "localcluster" / "bin"
JAX_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
REAL_VENV = pathlib.Path(os.environ.get("SGLANG_REAL_VENV")
                         or pathlib.Path.home() / ".cache" / "sao" / "sglang-0.5.23")
REAL_PYTHON = REAL_VENV / "bin" / "python"
HAVE_REAL = (REAL_VENV / ".installed").exists()
# sglang-jax on CPU for the tiny model: one prefill and one decode shape (as tests/e2e).
JAX_SERVER_ARGS = ("--max-total-tokens 2048 --max-running-requests 4 "
                   "--precompile-token-paddings 512 --precompile-bs-paddings 4")
# A run cut to what the tests check: 2 learner steps, a 2-prompt evaluation before and after.
RUN_SETS = ("run.steps=2", "run.progress=False", "critic.value_pretrain_steps=0",
            "eval.num_prompts=2", "eval.every=0", "checkpoint.every=2", "learner.entropy_coef=0.001")


def free_ports(n: int) -> int:
    """A base port p with p .. p + n - 1 free on 127.0.0.1 a moment ago."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65000:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def box_env(box_dir: pathlib.Path) -> dict:
    """The environment of a user who put the box's shims first on PATH (outside .venv too)."""
    return {**os.environ, "PATH": f"{SHIMS}:{os.environ['PATH']}", box.DIR_ENV: str(box_dir),
            "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}


def fleet_flags() -> tuple[str, str, str]:
    """``(backend, sglang_python, extra sglang_fleet flags)`` of a CPU fleet: the real SGLang
    server when installed (weights reloaded from disk, no restart), else sglang-jax."""
    if HAVE_REAL:
        return "torch", str(REAL_PYTHON), "--device=cpu"
    return "jax", str(JAX_PYTHON), f"--device=cpu '--server_args={JAX_SERVER_ARGS}'"


def run(argv: list[str], env: dict, timeout: float = 1500) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"\n{' '.join(argv[1:3])}: {time.monotonic() - t0:.0f} s, exit {out.returncode}")
    return out


def logs(workdir: pathlib.Path) -> str:
    """Tails of the run's logs (for assertion messages)."""
    return "".join(f"\n--- {p}\n{p.read_text(errors='replace')[-3000:]}"
                   for p in sorted(workdir.glob("**/*.log")) + sorted(workdir.glob("slurm-*.out")))
