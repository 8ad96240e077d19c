"""A bf16 inference engine beside an f32 learner: the train/inference mismatch
of production (``rollout.engine_dtype``), measured at lag 0."""
import asyncio
import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from sao import components
from sao.ckpt import latest_published, publish
from sao.models import Transformer, get_preset
from sao.rollout import SamplingParams
from sao.rollout.jax_engine import JaxEngine
from sao.models import token_logprobs

CFG = dataclasses.replace(get_preset("tiny"), hidden_size=64, num_layers=1, num_heads=2,
                          num_kv_heads=1, intermediate_size=128)
PAD = 64


def prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=int(rng.integers(3, 20))).tolist() for _ in range(n)]


def recomputed(model, prompt, completion, temperature):
    """The f32 learner's log-probs of the completion."""
    seq = np.zeros((1, PAD), np.int32)
    n = len(prompt) + len(completion.tokens)
    seq[0, :n] = prompt + completion.tokens
    lp = np.asarray(token_logprobs(model, jnp.asarray(seq), temperature=temperature))[0]
    return lp[len(prompt):n]


def _sample(engine_kw, model, tmp_path=None, other=None):
    sp = SamplingParams(max_new_tokens=24)

    async def main():
        engine = JaxEngine(model, max_slots=4, max_len=64, seed=3, **engine_kw)
        try:
            out = await asyncio.gather(*(engine.generate(p, sp) for p in prompts(4, seed=2)))
            loaded = None
            if other is not None:     # a worker's path: an f32 publish, restored and cast
                publish(str(tmp_path / "pub"), 1, nnx.state(other, nnx.Param))
                await engine.load_weights(*latest_published(str(tmp_path / "pub")))
                loaded = await engine.generate([5, 6, 7], sp)
            return out, loaded, engine
        finally:
            await engine.close()
    return asyncio.run(main())


def _abs_diffs(model, completions, ps):
    return np.concatenate([np.abs(np.asarray(c.logprobs) - recomputed(model, p, c, 1.0))
                           for p, c in zip(ps, completions)])


def test_bf16_engine_logprobs_differ_from_f32_learner_at_lag_0(tmp_path):
    model, other = Transformer(CFG, rngs=nnx.Rngs(0)), Transformer(CFG, rngs=nnx.Rngs(1))
    ps = prompts(4, seed=2)
    f32, _, _ = _sample({}, model)
    bf16, loaded, engine = _sample({"serve_dtype": "bfloat16"}, model, tmp_path, other)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(engine._params))
    assert all(c.versions == [0] * len(c.tokens) for c in bf16)        # lag 0: same weights
    same = _abs_diffs(model, f32, ps)
    diff = _abs_diffs(model, bf16, ps)
    assert same.max() < 1e-5                                    # f32 engine: exact
    # bf16 weights (8-bit mantissa): every token's log-prob moves, by ~1e-3..1e-1 nats here
    assert np.mean(diff) > 1e-4 and np.mean(diff > 1e-5) > 0.9, np.mean(diff)
    assert diff.max() < 1.0
    # weights loaded from an f32 publish are served in bf16 too, and are the new model's
    assert loaded.versions == [1] * len(loaded.tokens)
    d = np.abs(np.asarray(loaded.logprobs) - recomputed(other, [5, 6, 7], loaded, 1.0))
    assert np.mean(d) > 1e-4 and d.max() < 1.0


def test_engine_dtype_config_is_checked():
    cfg = ml_collections.ConfigDict({"rollout": {"engine_dtype": "bfloat16"}})
    assert components.engine_dtype(cfg) == "bfloat16"
    cfg.rollout.engine_dtype = ""
    assert components.engine_dtype(cfg) is None
    cfg.rollout.engine_dtype = "int8"
    with pytest.raises(ValueError, match="engine_dtype"):
        components.engine_dtype(cfg)
