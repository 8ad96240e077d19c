"""Launch, wait for and stop an SGLang server process (for tests and workers).

Two servers speak the same HTTP API: sglang-jax (``sgl_jax.launch_server``,
JAX on CPU/TPU) and SGLang (``sglang.launch_server``, PyTorch on GPU, or on
CPU with its CPU engine: ``TORCH_CPU_ARGS``, ``SGLANG_USE_CPU_ENGINE=1``).
Readiness is the server's own log line "The server is fired up and ready to
roll!" (both print it) plus ``GET /health``: the CPU server (sglang-jax)
answers /health before its warm-up request finished and a request sent then
can crash it. The server runs in its own process group, and ``stop`` ends
the whole group (SIGTERM, then SIGKILL after ``stop_timeout_s``): the server
forks a scheduler and a detokenizer that must not outlive it. With
``die_with_parent`` (default, Linux with util-linux's ``setpriv``) the kernel
also kills the server when the process that started it dies, e.g. a rollout
worker SIGKILLed before it could stop its server; its scheduler and
detokenizer end with it on their own. (The kernel's parent-death signal
follows the *thread* that forked: every server is forked by one thread that
lives as long as the process, so ``start`` may be called from any thread,
e.g. ``asyncio.to_thread`` in a loop that ends before the server should.)
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

# The one thread that forks every server: it lives until the interpreter shuts down (it
# is joined right after the main thread returns), so a server's parent-death signal,
# which the kernel ties to the forking thread, fires then or when the process dies,
# not when a short-lived caller thread ends. (A process forked from this one without
# exec must not start servers: the executor's thread is not in the child.)
_FORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sglang-server-fork")

READY_LINE = "fired up and ready to roll"
START_MARK = "[sao] starting: "  # first line of each start in the log

# sglang-jax on CPU (docs/rollout.md): the flags that make a tiny model start in ~30 s.
JAX_CPU_ARGS: tuple[str, ...] = (
    "--device", "cpu", "--attention-backend", "native", "--dtype", "float32",
    "--max-total-tokens", "4096", "--max-running-requests", "16",
    "--precompile-token-paddings", "64", "512", "--precompile-bs-paddings", "1", "8", "16")

# SGLang (PyTorch) on CPU (docs/rollout.md): its CPU engine with torch-native
# attention in float32, a KV pool sized for tests (by default it takes ~70% of
# free memory: 12 GB and 45 s of allocation for a tiny model), and a scheduler
# that waits on its sockets when idle: without --sleep-on-idle it polls them in
# a loop, one full core per server (18 CPU-s in 20 s idle, 0 with it; sglang
# 0.5.23, 2026-12-04) taken from the worker and learner beside it. (sglang-jax
# 0.1.0rc0 accepts the flag and ignores it: its idle server still takes ~0.8 core.)
TORCH_CPU_ARGS: tuple[str, ...] = (
    "--device", "cpu", "--dtype", "float32", "--disable-overlap-schedule",
    "--max-total-tokens", "4096", "--max-running-requests", "16", "--sleep-on-idle")
# SGLang's CPU engine imports sgl_kernel, whose only published build needs CUDA: this
# directory, first on the server's PYTHONPATH, holds the stand-in that lets it import.
SGL_KERNEL_CPU_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sgl_kernel_cpu")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SGLangServer:
    """One SGLang server process serving ``model_path`` (an HF directory).

    Args:
      model_path: HF model directory (config.json + safetensors).
      python: interpreter of the SGLang environment (e.g. ``.venv-sglang/bin/python``).
      module: ``"sgl_jax.launch_server"`` (JAX/CPU/TPU) or ``"sglang.launch_server"``
        (PyTorch: GPU, or CPU with ``TORCH_CPU_ARGS``); both speak the same HTTP API.
      args: extra launch flags (default ``JAX_CPU_ARGS`` for sgl_jax, none otherwise).
      host, port: where it listens (default a free port on 127.0.0.1).
      log_path: file receiving the server's stdout+stderr (default
        ``/tmp/sglang-<port>.log``); each start appends to it after a line
        ``[sao] starting: <command>`` (restarts stay readable one after another).
      env: extra environment variables (``JAX_PLATFORMS=cpu`` is set for
        sgl_jax, ``SGLANG_USE_CPU_ENGINE=1`` for sglang with ``--device cpu``);
        the caller's ``XLA_FLAGS`` are not passed on unless given here.
      python_path: directories put first on the server's ``PYTHONPATH``
        (before the caller's), e.g. a module that must shadow an installed one.
      ready_timeout_s: how long ``start`` waits for readiness.
      die_with_parent: start it under ``setpriv --pdeathsig KILL`` (where
        ``setpriv`` exists): the kernel kills it when this process dies.
      nice: the server's niceness, 0-19 (``nice -n``; 0: the caller's). On a CPU machine
        it shares with a learner: sglang-jax's idle scheduler polls its sockets in a loop
        (~0.8 core per server, ``--sleep-on-idle`` does not stop it in 0.1.0rc0) and a
        niced server gives those cycles up when the learner needs them.

    Raises ValueError for ``nice`` outside 0-19.
    """

    def __init__(self, model_path: str, *, python: str, module: str = "sgl_jax.launch_server",
                 args: Sequence[str] | None = None, host: str = "127.0.0.1",
                 port: int | None = None, log_path: str | None = None,
                 env: dict[str, str] | None = None, python_path: Sequence[str] = (),
                 ready_timeout_s: float = 300.0, stop_timeout_s: float = 20.0,
                 die_with_parent: bool = True, nice: int = 0):
        if not (isinstance(nice, int) and 0 <= nice <= 19):
            raise ValueError(f"nice must be an int in 0-19, got {nice!r}")
        self.nice = nice
        self.model_path = model_path
        self.python = python
        self.module = module
        self.args = tuple(args) if args is not None else (
            JAX_CPU_ARGS if module.startswith("sgl_jax") else ())
        self.host = host
        self.port = port or free_port()
        self.log_path = log_path or f"/tmp/sglang-{self.port}.log"
        self.env = dict(env or {})
        self.python_path = tuple(str(p) for p in python_path)
        if module.startswith("sgl_jax"):
            self.env.setdefault("JAX_PLATFORMS", "cpu")
        elif _flag_value(self.args, "--device") == "cpu":
            self.env.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen | None = None
        self._log_offset = 0

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The launch command (for dry runs and docs)."""
        return [self.python, "-m", self.module, "--model-path", self.model_path,
                "--host", self.host, "--port", str(self.port), "--skip-tokenizer-init",
                *self.args]

    def launch_argv(self) -> list[str]:
        """``command()`` as started: under ``setpriv --pdeathsig KILL`` with ``die_with_parent``,
        under ``nice -n <nice>`` when ``nice`` > 0."""
        setpriv = shutil.which("setpriv") if self.die_with_parent else None
        nice = ["nice", "-n", str(self.nice)] if self.nice else []
        return ([setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []) + nice + self.command()

    def environment(self) -> dict[str, str]:
        """The server's environment: the caller's without ``XLA_FLAGS`` (e.g. 8
        fake CPU devices in tests are not the server's), plus ``env``, with
        ``python_path`` in front of ``PYTHONPATH``."""
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        env.update(self.env)
        if self.python_path:
            env["PYTHONPATH"] = os.pathsep.join(
                [*self.python_path, *filter(None, [env.get("PYTHONPATH")])])
        return env

    def start(self) -> None:
        """Starts the server and blocks until it is ready.

        Raises RuntimeError (with the log's tail) if the process exits or is
        not ready within ``ready_timeout_s``; the process group is then stopped.
        """
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"server already running (pid {self.proc.pid})")
        with open(self.log_path, "ab") as log:
            log.write(f"{START_MARK}{shlex.join(self.command())}\n".encode())
            log.flush()
            self._log_offset = log.tell()  # readiness and errors: this start's lines only
            self.proc = _FORKER.submit(
                subprocess.Popen, self.launch_argv(), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=self.environment(), start_new_session=True).result()
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"SGLang server exited with {self.proc.returncode}:\n{tail}")
            if READY_LINE in self._read_log() and self._health_ok():
                return
            time.sleep(0.5)
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"SGLang server not ready after {self.ready_timeout_s} s:\n{tail}")

    def stop(self) -> None:
        """Ends the server's process group and reaps the server (idempotent, never raises)."""
        proc = self.proc
        if proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, self.stop_timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if proc.poll() is not None and not process_group_alive(proc.pid):
                    break
                time.sleep(0.2)
            else:
                continue  # still alive: escalate
            break
        try:
            proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            pass

    def running(self) -> bool:
        """True while the server process started by `start` has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def restart(self, model_path: str | None = None) -> None:
        """Stops the server and starts it again, on ``model_path`` if given."""
        self.stop()
        if model_path is not None:
            self.model_path = model_path
        self.start()

    def log_tail(self, n_chars: int = 4000) -> str:
        """The end of what the current (or last) start wrote."""
        return self._read_log()[-n_chars:]

    def _read_log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _health_ok(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def __enter__(self) -> "SGLangServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``args`` (``--flag v`` or ``--flag=v``; last wins)."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def process_group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` runs (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie member keeps the group "alive" until reaped; check /proc where it exists.
    if not os.path.isdir("/proc"):
        return True
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return any(_pgid_of(p) == pgid for p in pids)


def _pgid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()
        return int(fields[2]) if fields[0] != "Z" else None
    except (OSError, ValueError, IndexError):
        return None
