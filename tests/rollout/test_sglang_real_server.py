"""SGLangEngine against the real SGLang server (PyTorch, CPU engine).

`make sglang-real-venv` installs ``sglang==0.5.23`` once per machine outside
the clone (tests/rollout/sglang_real.py). The server serves a tiny random
Qwen3 (head_dim 128) published by `sao.ckpt.publish` with our HF exporter;
its log-probs of the tokens it generated must equal our `token_logprobs`,
and after ``/update_weights_from_disk`` with a second published version
they must follow the new weights. Timings are printed (``pytest -s``).
"""
import asyncio
import time

import numpy as np
import pytest
from flax import nnx

from sao.ckpt import hf_dir, publish
from sao.models import Transformer, save_pretrained
from sao.models.tokenizer import ByteTokenizer
from sao.rollout import SamplingParams
from sao.rollout.sglang_engine import SGLangEngine
from sao.rollout.sglang_server import process_group_alive
from sglang_real import needs_real_sglang, real_server
from sglang_jax import CFG, recomputed

pytestmark = [pytest.mark.slow, pytest.mark.sglang, needs_real_sglang]


def test_real_sglang_logprobs_match_and_update_weights_from_disk(tmp_path):
    tok = ByteTokenizer()
    models = [Transformer(CFG, rngs=nnx.Rngs(seed)) for seed in (0, 1)]
    uris = []
    for version, model in zip((1, 2), models):
        params = nnx.state(model, nnx.Param)
        uris.append(publish(str(tmp_path / "publish"), version, params,
                            hf_export=lambda p: save_pretrained(params, CFG, p, tok)))
    server = real_server(hf_dir(uris[0]), log_path=str(tmp_path / "server.log"),
                         ready_timeout_s=600)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, size=int(n)).tolist() for n in (5, 9, 17, 30)]
    cases = [(prompts[0], SamplingParams(temperature=1.0, max_new_tokens=60)),
             (prompts[1], SamplingParams(temperature=1.0, max_new_tokens=12,
                                         stop_token_ids=tuple(range(0, 256, 9)))),
             (prompts[2], SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12)),
             (prompts[3], SamplingParams(temperature=0.7, max_new_tokens=12)),
             (prompts[3], SamplingParams(temperature=0.7, max_new_tokens=12))]  # cached prefix
    timings = {}

    async def main(engine):
        assert await engine.health()
        first = list(await asyncio.gather(*(engine.generate(p, sp) for p, sp in cases[:3])))
        for p, sp in cases[3:]:
            first.append(await engine.generate(p, sp))
        scores.append(await engine.score(prompts[1:]))  # prompts cached by now
        t0 = time.perf_counter()
        await engine.load_weights(2, uris[1])  # a publish uri: its hf/ is loaded
        timings["update_weights_from_disk_s"] = time.perf_counter() - t0
        second = await engine.generate(prompts[1], SamplingParams(max_new_tokens=12))
        scores.append(await engine.score(prompts[1:]))
        await engine.close()
        return first, second

    scores = []  # Engine.score (the parity gate's probe) before and after the update
    t0 = time.perf_counter()
    try:
        server.start()
        timings["start_s"] = time.perf_counter() - t0
        engine = SGLangEngine(server.base_url, version=1, timeout_s=120)
        first, second = asyncio.run(main(engine))
    finally:
        server.stop()
    assert server.proc.returncode is not None and not process_group_alive(server.proc.pid)
    errors = []
    for (prompt, sp), c in zip(cases, first):
        assert c.versions == [1] * len(c.tokens) and len(c.tokens) <= sp.max_new_tokens
        if c.finish_reason == "stop":
            assert c.tokens[-1] in sp.stop_token_ids + (tok.eos_id,)
        ours = recomputed(models[0], prompt, c.tokens, sp.temperature)
        errors.append(float(np.abs(np.asarray(c.logprobs) - ours).max()))
    assert max(errors) <= 1e-4, f"max |server - ours| per request: {errors}"
    # The server labels tokens with the weight version it was given.
    assert second.versions == [2] * len(second.tokens)
    ours = recomputed(models[1], prompts[1], second.tokens, 1.0)
    old = recomputed(models[0], prompts[1], second.tokens, 1.0)
    gap = float(np.abs(np.asarray(second.logprobs) - ours).max())
    assert gap <= 1e-4 and float(np.abs(np.asarray(second.logprobs) - old).max()) > 1e-2
    score_gaps = []
    for model, scored in zip(models, scores):  # prompt log-probs: the learner's, per version
        for p, got in zip(prompts[1:], scored):
            assert got[0] == 0.0 and len(got) == len(p)
            score_gaps.append(float(np.abs(np.asarray(got[1:]) -
                                           recomputed(model, p[:1], p[1:], 1.0)).max()))
    assert max(score_gaps) <= 1e-4, score_gaps
    print(f"\nreal SGLang CPU: start {timings['start_s']:.1f} s, max |logp gap| "
          f"{max(errors):.2e} (v1) {gap:.2e} (v2), /update_weights_from_disk "
          f"{timings['update_weights_from_disk_s']:.3f} s")
