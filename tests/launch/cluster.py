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
# sglang-jax on CPU for the tiny model: one prefill and one decode shape (the TPU VM box run's
# --server_args, test_cluster_runs.py).
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


def user_env() -> dict:
    """A user's environment outside .venv: no venv bin on PATH, no test XLA flags."""
    venv_bin = str(ROOT / ".venv" / "bin")
    path = ":".join(p for p in os.environ["PATH"].split(":") if os.path.realpath(p) != os.path.realpath(venv_bin))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "XLA_FLAGS")}
    return {**env, "PATH": path, "JAX_PLATFORMS": "cpu"}


def box_env(box_dir: pathlib.Path) -> dict:
    """The environment of a user who put the box's shims first on PATH (outside .venv too)."""
    env = user_env()
    return {**env, "PATH": f"{SHIMS}:{env['PATH']}", box.DIR_ENV: str(box_dir),
            "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}


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


def readme_commands() -> list[str]:
    """The commands of README.md's "Full scale" block, continuation lines joined, comments dropped."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Full scale", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip() and not c.startswith("#")]


def readme_command(*needles: str) -> str:
    """The one README command holding every needle."""
    found = [c for c in readme_commands() if all(n in c for n in needles)]
    assert len(found) == 1, (needles, found)
    return found[0]


def in_tmp(command: str, tmp: pathlib.Path, box_dir: pathlib.Path | None = None) -> str:
    """A README command with its ``runs/`` (and ``$PWD/runs/``) under ``tmp`` and the box at ``box_dir``."""
    import re
    command = re.sub(r"(\$PWD/)?\bruns/", f"{tmp}/runs/", command)
    return command.replace("/tmp/sao-box", str(box_dir)) if box_dir else command


def run_shell(command: str, env: dict, timeout: float = 1500) -> subprocess.CompletedProcess:
    """``bash -c command`` from the repository root, as a user types it (PATH's python)."""
    t0 = time.monotonic()
    out = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    print(f"\n{command[:100]}...: {time.monotonic() - t0:.0f} s, exit {out.returncode}")
    return out



def tagged_env(env: dict, box_dir: pathlib.Path, tag: str = "local") -> dict:
    """``env`` with the box's tag (as a box job's processes carry it) for a launch run
    outside the box, so that ``left_running`` finds everything it started."""
    return {**env, box.DIR_ENV: str(box_dir), box.TAG_ENV: tag, "SPT_NOENV": "1"}


def left_running(box_dir: pathlib.Path, grace_s: float = 10.0) -> dict[int, str]:
    """Processes tagged for ``box_dir`` still alive after ``grace_s``; they are then killed
    (so that a failing test leaves nothing behind either)."""
    deadline = time.monotonic() + grace_s
    while (left := box.tagged(str(box_dir))) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return left
