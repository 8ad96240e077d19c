"""Weight push: publish (orbax params + HF export) and reload, against raw byte copies.

    .venv/bin/python benchmarks/weight_push.py                 # both models, no server
    .venv/bin/python benchmarks/weight_push.py --restart       # + sglang-jax restarts (make sglang-venv)

Two Qwen3-shaped float32 models with head_dim 128 (what sglang-jax serves):
``qwen3-50m`` (49M parameters) and ``qwen3-135m`` (138M). For each, in one
process and one run, best of ``--repeats`` (the machine is shared):

* ``publish_s``: ``sao.ckpt.publish`` of the actor's ``nnx.Param`` state with
  the HF export (``sao.models.save_pretrained`` + byte tokenizer), split into
  ``orbax_s`` and ``hf_export_s``; the bytes written are the params twice.
* ``reload_s``: ``JaxEngine.load_weights(version, uri)`` of the published uri
  (orbax restore onto the served model's structure and device), engine idle.
* ``hf_read_s``: the disk update path: the export's safetensors read back
  into arrays (what ``/update_weights_from_disk`` reads; ``load_hf_state``).
* The reference, in the same run: ``raw_write_s`` writes the same bytes as
  publish (the params' buffers, twice, each file fsync'd: orbax's
  TensorStore fsyncs its files too) and ``raw_read_s`` reads one copy back
  into one fresh array (``np.fromfile``). Reads come from the page cache for
  both, right after the write.

Ratios: ``publish_reload_ratio = (publish_s + reload_s) / (raw_write_s +
raw_read_s)`` and ``publish_disk_ratio = (publish_s + hf_read_s) / (same)``;
target ≤ 2.

With ``--restart`` the export is also served by a sglang-jax CPU server
(``.venv-sglang``, the environment a run's workers give it:
``sao.sglang_setup.JAX_CACHE_ENV``, XLA's persistent compilation cache, here
in a fresh directory): ``server_start_s`` (cold start on the newest version
but one, empty cache) and ``restart_reload_s``
(``SGLangEngine(reload="restart").load_weights`` of the newest: stop, start
on the new export, ready; the cache is warm, as on every reload of a run).
They are reported apart: reading the export takes ``hf_read_s`` of them, the
rest is the server process itself (imports, JAX start-up, model init,
compiling or loading its token / batch paddings, warm-up request).

Prints one JSON line per model.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import pathlib
import shutil
import tempfile
import time

import jax
import numpy as np
from flax import nnx

from sao import ckpt
from sao.models import Transformer, get_preset, save_pretrained
from sao.models.hf import load_hf_state
from sao.models.tokenizer import ByteTokenizer
from sao.rollout import SamplingParams
from sao.rollout.jax_engine import JaxEngine
from sao.rollout.sglang_engine import SGLangEngine
from sao.rollout.sglang_server import SGLangServer
from sao.sglang_setup import JAX_CACHE_ENV

ROOT = pathlib.Path(__file__).resolve().parents[1]
SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
# Qwen3 shapes, head_dim 128 (sglang-jax serves no other), untied head.
MODELS = {
    "qwen3-50m": dict(vocab_size=32768, hidden_size=512, num_layers=5, num_heads=4,
                      num_kv_heads=2, head_dim=128, intermediate_size=1536),
    "qwen3-135m": dict(vocab_size=49152, hidden_size=768, num_layers=10, num_heads=6,
                       num_kv_heads=2, head_dim=128, intermediate_size=2048),
}
SERVER_ARGS = ("--device", "cpu", "--attention-backend", "native", "--dtype", "float32",
               "--max-total-tokens", "1024", "--max-running-requests", "4",
               "--precompile-token-paddings", "64", "--precompile-bs-paddings", "1",
               "--disable-overlap-schedule")


def model_config(name: str):
    return dataclasses.replace(get_preset("tiny"), **MODELS[name], rope_theta=1_000_000.0,
                               tie_word_embeddings=False, max_position_embeddings=1024)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def raw_write(leaves, paths) -> None:
    """The params' bytes into each of ``paths`` (device→host once per copy), fsync'd."""
    for path in paths:
        with open(path, "wb") as f:
            for leaf in leaves:
                f.write(memoryview(np.ascontiguousarray(np.asarray(leaf))).cast("B"))
            f.flush()
            os.fsync(f.fileno())


def raw_read(path: str, dtype) -> np.ndarray:
    """The file's bytes into one fresh host array (on CPU the device's memory)."""
    return np.fromfile(path, dtype=dtype)


def bench_model(name: str, work: str, repeats: int, restart: bool) -> dict:
    cfg = model_config(name)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    leaves = jax.tree.leaves(params)
    n_params = int(sum(x.size for x in leaves))
    nbytes = int(sum(x.nbytes for x in leaves))
    tok = ByteTokenizer()
    pub = os.path.join(work, f"publish-{name}")
    raw = [os.path.join(work, f"raw-{name}-{i}.bin") for i in range(2)]
    engine = JaxEngine(Transformer(cfg, rngs=nnx.Rngs(1)), max_slots=1, max_len=64, version=0)
    best: dict[str, float] = {}
    uris = []

    def keep(key, seconds):
        best[key] = min(best.get(key, float("inf")), seconds)

    for rep in range(repeats):
        keep("raw_write_s", timed(lambda: raw_write(leaves, raw)))
        keep("raw_read_s", timed(lambda: raw_read(raw[0], np.float32)))
        hf_s = []

        def export(path):
            t0 = time.perf_counter()
            save_pretrained(params, cfg, path, tok)
            hf_s.append(time.perf_counter() - t0)

        version = rep + 1
        t0 = time.perf_counter()
        uris.append(ckpt.publish(pub, version, params, hf_export=export, keep=2))
        publish_s = time.perf_counter() - t0
        keep("publish_s", publish_s)
        keep("hf_export_s", hf_s[0])
        keep("orbax_s", publish_s - hf_s[0])
        keep("reload_s", timed(lambda: asyncio.run(engine.load_weights(version, uris[-1]))))
        keep("hf_read_s", timed(lambda: load_hf_state(ckpt.hf_dir(uris[-1]))))
        for path in raw:
            os.remove(path)
    assert engine.version == repeats
    served = jax.tree.leaves(engine._params)
    assert all(np.array_equal(a, b) for a, b in zip(served, leaves)), "reload changed the weights"
    raw_s = best["raw_write_s"] + best["raw_read_s"]
    out = {"benchmark": "weight_push", "model": name, "params": n_params,
           "mbytes": round(nbytes / 2 ** 20, 1), "repeats": repeats,
           **{k: round(v, 3) for k, v in sorted(best.items())},
           "publish_reload_ratio": round((best["publish_s"] + best["reload_s"]) / raw_s, 2),
           "publish_disk_ratio": round((best["publish_s"] + best["hf_read_s"]) / raw_s, 2)}
    if restart:
        out.update(bench_restart(uris[-2:], work, name))
    return out


def bench_restart(uris: list[str], work: str, name: str) -> dict:
    """Cold start of a sglang-jax server on ``uris[0]``'s export (empty compilation cache),
    then a restart reload onto ``uris[1]``'s (warm cache); seconds."""
    env = {**JAX_CACHE_ENV, "JAX_COMPILATION_CACHE_DIR": os.path.join(work, f"xla-cache-{name}")}
    server = SGLangServer(ckpt.hf_dir(uris[0]), python=str(SGLANG_PYTHON), args=SERVER_ARGS,
                          log_path=os.path.join(work, f"sglang-{name}.log"), env=env,
                          ready_timeout_s=900)
    v0, v1 = (int(os.path.basename(os.path.dirname(u))[1:]) for u in uris)
    try:
        start_s = timed(server.start)
        engine = SGLangEngine(server.base_url, version=v0, server=server, reload="restart",
                              timeout_s=900)

        async def reload():
            t0 = time.perf_counter()
            await engine.load_weights(v1, uris[1])
            seconds = time.perf_counter() - t0
            out = await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
            await engine.close()
            assert out.versions == [v1, v1]  # the restarted server answers, at the new version
            return seconds
        restart_s = asyncio.run(reload())
    finally:
        server.stop()
    return {"server_start_s": round(start_s, 1), "restart_reload_s": round(restart_s, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--restart", action="store_true", help="also time sglang-jax server restarts")
    ap.add_argument("--workdir", default="", help="where to write (default: a fresh temp dir)")
    args = ap.parse_args()
    if args.restart and args.repeats < 2:
        ap.error("--restart needs --repeats >= 2 (it serves the newest version but one, then restarts)")
    if args.restart and not SGLANG_PYTHON.exists():
        raise SystemExit(f"--restart needs {SGLANG_PYTHON} (make sglang-venv)")
    work = args.workdir or tempfile.mkdtemp(prefix="sao-weight-push-")
    os.makedirs(work, exist_ok=True)
    try:
        for name in args.models.split(","):
            print(json.dumps(bench_model(name, work, args.repeats, args.restart)), flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
