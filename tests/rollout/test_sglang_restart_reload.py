"""Restart reloads against a real sglang-jax server on CPU (`make sglang-venv`).

sglang-jax has no ``/update_weights_from_disk`` (it answers 404), so a worker
serving it reloads by restarting the ``SGLangServer`` it supervises on the
new version's HF export. Published versions (`sao.ckpt.publish` with our HF
exporter) are loaded by their publish uri; after the restart the log-probs
follow the new weights. A version whose export the server cannot load fails
the restart; two failures in a row make the engine unusable, and it says so
at once from then on. Timings are printed (``pytest -s``).
"""
import asyncio
import os
import shutil
import time

import numpy as np
import pytest
from flax import nnx

from sao.ckpt import hf_dir, publish
from sao.models import Transformer, save_pretrained
from sao.models.tokenizer import ByteTokenizer
from sao.rollout import EngineError, SamplingParams
from sao.rollout.sglang_engine import SGLangEngine
from sao.rollout.sglang_server import SGLangServer, process_group_alive
from test_sglang_server import CFG, PYTHON, SERVER_ARGS, recomputed

pytestmark = [pytest.mark.slow, pytest.mark.sglang,
              pytest.mark.skipif(not PYTHON.exists(), reason=f"no {PYTHON} (`make sglang-venv`)")]


def test_sglang_jax_restart_reload_and_bounded_failures(tmp_path):
    tok = ByteTokenizer()
    models = [Transformer(CFG, rngs=nnx.Rngs(seed)) for seed in (0, 1)]
    uris = []
    for version, model in zip((1, 2), models):
        params = nnx.state(model, nnx.Param)
        uris.append(publish(str(tmp_path / "publish"), version, params,
                            hf_export=lambda p: save_pretrained(params, CFG, p, tok)))
    broken = tmp_path / "broken"  # a config and no weights
    broken.mkdir()
    shutil.copy(os.path.join(hf_dir(uris[0]), "config.json"), broken)
    server = SGLangServer(hf_dir(uris[0]), python=str(PYTHON), args=SERVER_ARGS,
                          log_path=str(tmp_path / "server.log"), ready_timeout_s=600)
    prompt = np.random.default_rng(0).integers(0, 256, size=9).tolist()
    sampling = SamplingParams(max_new_tokens=12)
    timings = {}

    async def main(engine):
        first = await engine.generate(prompt, sampling)
        attached = SGLangEngine(server.base_url, version=1, max_retries=0)
        with pytest.raises(EngineError, match="HTTP 404"):  # no such endpoint here
            await attached.load_weights(2, uris[1])
        await attached.close()
        t0 = time.perf_counter()
        await engine.load_weights(2, uris[1])
        timings["restart_reload_s"] = time.perf_counter() - t0
        second = await engine.generate(prompt, sampling)
        t0 = time.perf_counter()
        with pytest.raises(EngineError, match="restarting the server"):
            await engine.load_weights(3, str(broken))
        timings["failed_restart_s"] = time.perf_counter() - t0
        assert not await engine.health() and not server.running() and engine.unusable is None
        with pytest.raises(EngineError, match="restarting the server"):
            await engine.load_weights(3, str(broken))
        assert "2 weight loads failed in a row" in engine.unusable
        with pytest.raises(EngineError, match="unusable"):
            await engine.load_weights(3, uris[1])
        with pytest.raises(EngineError, match="unusable"):
            await engine.generate(prompt, sampling)
        await engine.close()
        return first, second, engine.version

    t0 = time.perf_counter()
    try:
        server.start()
        timings["start_s"] = time.perf_counter() - t0
        engine = SGLangEngine(server.base_url, version=1, server=server, reload="restart",
                              max_reload_failures=2, timeout_s=120)
        first, second, version = asyncio.run(main(engine))
    finally:
        server.stop()
    assert server.proc.returncode is not None and not process_group_alive(server.proc.pid)
    assert version == 2 and first.versions == [1] * len(first.tokens)
    assert second.versions == [2] * len(second.tokens)
    gaps = [float(np.abs(np.asarray(c.logprobs) - recomputed(m, prompt, c.tokens, 1.0)).max())
            for c, m in ((first, models[0]), (second, models[1]))]
    assert max(gaps) <= 1e-4, gaps
    stale = recomputed(models[0], prompt, second.tokens, 1.0)
    assert float(np.abs(np.asarray(second.logprobs) - stale).max()) > 1e-2
    print(f"\nsglang-jax CPU: start {timings['start_s']:.1f} s, restart reload "
          f"{timings['restart_reload_s']:.1f} s, failed restart {timings['failed_restart_s']:.1f} s, "
          f"max |logp gap| {max(gaps):.2e}")
