"""The SGLang engine of a rollout worker, from the config (``rollout.engine="sglang"``).

Two ways, chosen by ``rollout.sglang`` (docs/rollout.md, "Workers and their servers"):

* **start and supervise** (``rollout.sglang.python`` set): the worker owns an
  ``SGLangServer`` launched from ``python -m <module> --model-path <dir>
  <args>`` with ``env`` and ``python_path``. It is started by the learner's
  first weight push, on that version's HF export (a worker has no weights of
  its own before it), and reloaded on every later push by
  ``reload``: ``"update_weights_from_disk"`` (SGLang) or ``"restart"``
  (sglang-jax, which has no such endpoint; the default for ``sgl_jax``
  modules). The engine stops it when the worker exits; a dead server is
  started again by the next push; ``max_reload_failures`` failed loads in a
  row make the worker report itself unusable, and the learner then raises
  ``FleetError`` naming it (``sao.fleet.link``).
* **attach by URL** (no ``python``): ``--sglang_url``, else line
  ``worker_index`` of ``rollout.sglang.url_file``; reloads by
  ``/update_weights_from_disk`` only (an attached server cannot be restarted).
"""
from __future__ import annotations

import os
import shlex

from sao.rollout.sglang_engine import RELOAD_MODES, SGLangEngine
from sao.rollout.sglang_server import SGLangServer


def reload_mode(cfg) -> str:
    """``rollout.sglang.reload``, or its default: ``"restart"`` for a started
    sglang-jax server, else ``"update_weights_from_disk"``. Raises ValueError
    for an unknown mode."""
    g = cfg.rollout.sglang
    mode = g.reload or ("restart" if g.python and g.module.startswith("sgl_jax")
                        else "update_weights_from_disk")
    if mode not in RELOAD_MODES:
        raise ValueError(f"rollout.sglang.reload must be one of {RELOAD_MODES}, got {mode!r}")
    return mode


def parse_env(text: str) -> dict[str, str]:
    """``"K=V K2='a b'"`` (shell-quoted) -> ``{"K": "V", "K2": "a b"}``; raises
    ValueError on an item without ``=``."""
    env = {}
    for item in shlex.split(text):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"rollout.sglang.env items are KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def server_url(cfg, worker_index: int, sglang_url: str = "") -> str:
    """The URL a worker attaches to: ``sglang_url``, else line ``worker_index``
    of ``rollout.sglang.url_file`` (blank lines and ``#`` comments skipped).

    Raises ValueError with neither, or when the file has too few URLs.
    """
    if sglang_url:
        return sglang_url
    path = cfg.rollout.sglang.url_file
    if not path:
        raise ValueError("rollout.engine='sglang' needs a server: set rollout.sglang.python "
                         "(the worker starts one), --sglang_url or rollout.sglang.url_file")
    with open(path, encoding="utf-8") as f:
        urls = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    if worker_index >= len(urls):
        raise ValueError(f"{path} lists {len(urls)} SGLang URLs; worker {worker_index} has none")
    return urls[worker_index]


# sglang-jax restarts on every reload: XLA's persistent cache keeps the compiled programs
# across restarts (and across the workers of a machine); rollout.sglang.env overrides.
JAX_CACHE_ENV = {"JAX_COMPILATION_CACHE_DIR": os.path.join("~", ".cache", "sao", "sglang-jax-xla"),
                 "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def make_server(cfg, worker_index: int, log_dir: str = "") -> SGLangServer:
    """The (not yet started) server of worker ``worker_index``: port
    ``rollout.sglang.port + worker_index`` (any free one for port 0), log
    ``<log_dir>/sglang<i>.log`` (``/tmp/sglang-<port>.log`` without
    ``log_dir``), environment ``rollout.sglang.env`` (for sglang-jax over
    ``JAX_CACHE_ENV``). Its model path is set by the first weight load."""
    g = cfg.rollout.sglang
    port = g.port + worker_index if g.port else None
    log_path = os.path.join(log_dir, f"sglang{worker_index}.log") if log_dir else None
    env = parse_env(g.env)
    if g.module.startswith("sgl_jax"):
        env = {**{k: os.path.expanduser(v) for k, v in JAX_CACHE_ENV.items()}, **env}
    return SGLangServer("", python=g.python, module=g.module,
                        args=shlex.split(g.args) if g.args else None, host=g.host, port=port,
                        log_path=log_path, env=env,
                        python_path=[p for p in g.python_path.split(os.pathsep) if p],
                        ready_timeout_s=g.ready_timeout_s, nice=int(g.get("nice", 0)))


def make_engine(cfg, *, worker_index: int, version: int, sglang_url: str = "",
                log_dir: str = "") -> SGLangEngine:
    """The worker's ``SGLangEngine`` (module doc): owning a started server, or attached.

    Raises ValueError as ``reload_mode``, ``server_url`` and ``SGLangEngine``
    (``reload="restart"`` needs a started server).
    """
    g = cfg.rollout.sglang
    kwargs = dict(version=version, timeout_s=g.request_timeout_s, reload=reload_mode(cfg),
                  reload_timeout_s=g.reload_timeout_s, max_reload_failures=g.max_reload_failures)
    if not g.python:
        return SGLangEngine(server_url(cfg, worker_index, sglang_url), **kwargs)
    server = make_server(cfg, worker_index, log_dir)
    return SGLangEngine(server.base_url, server=server, owns_server=True, **kwargs)
