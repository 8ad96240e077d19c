"""JaxEngine: log-probs match the learner's recomputation; weight swaps keep requests."""
import asyncio
import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sao.ckpt import latest_published, publish
from sao.models import Transformer, get_preset, token_logprobs
from sao.models.tokenizer import ByteTokenizer
from sao.rollout import EngineError, SamplingParams, run_episodes
from sao.rollout.jax_engine import JaxEngine
from sao.types import validate
from sampling_reference import truncated_logprobs

# Smaller than the `tiny` preset: this file is about scheduling, not capacity.
CFG = dataclasses.replace(get_preset("tiny"), hidden_size=64, num_layers=1, num_heads=2,
                          num_kv_heads=1, intermediate_size=128)
PAD = 64  # recomputation pads every sequence to one shape (one compile)


@pytest.fixture(scope="module")
def models():
    return Transformer(CFG, rngs=nnx.Rngs(0)), Transformer(CFG, rngs=nnx.Rngs(1))


@functools.partial(jax.jit, static_argnums=0)
def _logprobs(graphdef, params, seq, temperature):
    return token_logprobs(nnx.merge(graphdef, params), seq, temperature=temperature)


def recomputed(model, prompt, completion, temperature):
    """The learner's log-probs of the completion (right padding does not change them)."""
    seq = np.zeros((1, PAD), np.int32)
    n = len(prompt) + len(completion.tokens)
    seq[0, :n] = prompt + completion.tokens
    graphdef, params = nnx.split(model)
    lp = np.asarray(_logprobs(graphdef, params, seq, np.float32(temperature)))[0]
    return lp[len(prompt):n]


def prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=int(rng.integers(3, 20))).tolist() for _ in range(n)]


def test_concurrent_requests_logprobs_match_token_logprobs(models):
    model, _ = models
    stops = tuple(range(0, 272, 17))
    cases = [(p, SamplingParams(temperature=t, top_p=tp, top_k=k, max_new_tokens=n,
                                stop_token_ids=stops))
             for p, t, tp, k, n in zip(prompts(6), [1.0, 0.7, 1.0, 0.5, 1.3, 1.0],
                                       [1.0, 1.0, 0.9, 1.0, 1.0, 1.0], [0, 0, 0, 0, 5, 0],
                                       [12, 5, 12, 9, 12, 1])]

    async def main():
        engine = JaxEngine(model, max_slots=4, max_len=64)
        try:
            return await asyncio.gather(*(engine.generate(p, sp) for p, sp in cases)), engine.steps
        finally:
            await engine.close()
    completions, steps = asyncio.run(main())
    # 6 requests on 4 slots: continuous batching shares decode steps between rows.
    assert steps < sum(len(c.tokens) for c in completions)
    for (prompt, sp), c in zip(cases, completions):
        assert len(c.tokens) <= sp.max_new_tokens and c.versions == [0] * len(c.tokens)
        if c.finish_reason == "stop":
            assert c.tokens[-1] in stops
        else:
            assert len(c.tokens) == sp.max_new_tokens
        assert not any(t in stops for t in c.tokens[:-1])
        if sp.top_p < 1.0 or sp.top_k > 0:   # the truncated distribution the token came from
            np.testing.assert_allclose(c.logprobs, truncated_reference(model, prompt, c, sp),
                                       atol=1e-4)
            assert np.all(np.asarray(c.logprobs) >= recomputed(model, prompt, c, sp.temperature)
                          - 1e-5)                  # renormalised over fewer tokens: never lower
        else:
            np.testing.assert_allclose(c.logprobs, recomputed(model, prompt, c, sp.temperature),
                                       atol=1e-5)


def truncated_reference(model, prompt, completion, sp):
    """NumPy reference log-probs of the completion under top-p / top-k truncation."""
    seq = np.asarray([prompt + completion.tokens], np.int32)
    logits = np.asarray(model(jnp.asarray(seq)), np.float64)[0]
    return [truncated_logprobs(logits[len(prompt) + i - 1], sp.temperature, sp.top_p, sp.top_k)[t]
            for i, t in enumerate(completion.tokens)]


def test_swap_mid_generation_keeps_requests_and_orbax_reload(models, tmp_path):
    model, other = models
    publish(str(tmp_path / "publish"), 3, nnx.state(other, nnx.Param))  # the learner's publish
    version, path = latest_published(str(tmp_path / "publish"))
    sp = SamplingParams(max_new_tokens=40)  # ~10 chunks of 4: the swap lands mid-way

    async def main():
        engine = JaxEngine(model, max_slots=4, max_len=64, decode_chunk=4)
        try:
            tasks = [asyncio.create_task(engine.generate(p, sp)) for p in prompts(4, seed=1)]
            while engine.steps < 4:
                await asyncio.sleep(0.005)
            await engine.set_params(1, nnx.state(other, nnx.Param))
            swapped = await asyncio.gather(*tasks)
            with pytest.raises(ValueError, match="older"):
                await engine.set_params(0, nnx.state(model, nnx.Param))
            await engine.load_weights(version, path)  # idle engine: orbax restore, applied now
            after = await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=8,
                                                                    temperature=0.8))
            return swapped, after
        finally:
            await engine.close()
    swapped, after = asyncio.run(main())
    for c in swapped:
        assert len(c.tokens) == 40 and c.finish_reason == "length"
        assert c.versions == sorted(c.versions) and c.versions[0] == 0 and c.versions[-1] == 1
    assert after.versions == [3] * 8
    np.testing.assert_allclose(after.logprobs, recomputed(other, [1, 2, 3], after, 0.8), atol=1e-5)


def test_bad_requests_are_rejected(models):
    model, _ = models

    async def main():
        engine = JaxEngine(model, max_slots=4, max_len=64)
        try:
            with pytest.raises(ValueError, match="max_len"):
                await engine.generate(list(range(64)), SamplingParams())
            with pytest.raises(ValueError, match="vocab_size"):
                await engine.generate([1, 999], SamplingParams())
            with pytest.raises(ValueError, match="structure"):
                await engine.set_params(1, nnx.State({}))
            with pytest.raises(ValueError, match="set_params"):
                await engine.load_weights(1, nnx.state(model, nnx.Param))
            with pytest.raises(ValueError, match="nnx.State"):
                await engine.set_params(1, "ckpt/1")
            # A long budget is capped by the cache: finish "length" at max_len.
            c = await engine.generate([1] * 58, SamplingParams(max_new_tokens=100))
            assert len(c.tokens) == 6 and c.finish_reason == "length"
            assert await engine.health()
        finally:
            await engine.close()
    asyncio.run(main())


class _EchoEnv:
    """Answers every turn with a short observation; done after three turns."""

    def __init__(self):
        self.turns = 0

    def reset(self, prompt):
        return prompt["text"]

    def step(self, action_text):
        self.turns += 1
        done = self.turns >= 3
        return types.SimpleNamespace(observation_text=None if done else f"obs{self.turns}",
                                     done=done, reward=float(done), info={})


def test_agent_loop_on_jax_engine_logprobs_match_learner_over_whole_trajectory(models):
    """Multi-turn trajectories from the real engine: at every action token the
    engine's log-prob equals the learner's log-prob over the whole trajectory
    (observation tokens in the context, nothing re-tokenised)."""
    model, _ = models
    tok = ByteTokenizer()
    sp = SamplingParams(temperature=0.8, max_new_tokens=6, stop_token_ids=tuple(range(0, 256, 5)))

    async def main():
        engine = JaxEngine(model, max_slots=4, max_len=64)
        try:
            return await run_episodes(engine, _EchoEnv, tok,
                                      [{"prompt_id": f"p{i}", "text": f"q{i}?"} for i in range(4)],
                                      sp, concurrency=4, max_turns=3, max_total_tokens=60)
        finally:
            await engine.close()
    trajs = asyncio.run(main())
    for traj in trajs:
        assert validate(traj, vocab_size=CFG.vocab_size, learner_version=0) is None
        ours = recomputed(model, [], types.SimpleNamespace(tokens=traj.tokens.tolist()), 0.8)
        mask = traj.action_mask
        np.testing.assert_allclose(traj.rollout_logprobs[mask], ours[mask], atol=1e-5)
    assert any(t.metadata["num_turns"] > 1 for t in trajs)


def test_engine_serves_successive_event_loops(models):
    """Drivers call asyncio.run per evaluation with one engine."""
    model, _ = models
    engine = JaxEngine(model, max_slots=4, max_len=64)
    for _ in range(2):
        c = asyncio.run(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=3)))
        assert len(c.tokens) == 3
    asyncio.run(engine.close())


def test_cancelled_request_frees_its_slot_and_step_failure_fails_requests(models):
    model, _ = models

    async def main():
        engine = JaxEngine(model, max_slots=1, max_len=64, decode_chunk=2)
        try:
            doomed = asyncio.create_task(engine.generate([1, 2], SamplingParams(max_new_tokens=50)))
            while engine.steps < 2:
                await asyncio.sleep(0.005)
            doomed.cancel()  # its caller went away: the only slot must come back
            c = await asyncio.wait_for(engine.generate([3], SamplingParams(max_new_tokens=4)), 60)
            assert len(c.tokens) == 4 and engine.num_active == 0

            def broken():
                raise RuntimeError("device lost")
            engine._step_sync = broken
            with pytest.raises(EngineError, match="device lost"):
                await engine.generate([1], SamplingParams(max_new_tokens=5))
            assert not await engine.health()
            with pytest.raises(EngineError, match="failed earlier"):
                await engine.generate([1], SamplingParams())
        finally:
            await engine.close()
    asyncio.run(main())
