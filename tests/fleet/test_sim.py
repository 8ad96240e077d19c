"""The simulated workload the benchmarks rely on."""
import asyncio
import time

import numpy as np
import pytest

from sao.fleet import sim
from sao.rollout import SamplingParams


def test_lognormal_lengths_are_long_tailed():
    ps = sim.lognormal_prompts(4000, median=64, sigma=1.0, seed=0)
    lengths = np.array([p["length"] for p in ps])
    assert 55 <= np.median(lengths) <= 75
    assert np.percentile(lengths, 99) / np.percentile(lengths, 50) >= 9.0
    assert len({p["prompt_id"] for p in ps}) == 4000


def test_latency_grows_with_length_and_swaps_mid_request():
    engine = sim.SimulatedEngine(seconds_per_token=2e-3, chunk_tokens=10)

    async def run():
        t0 = time.perf_counter()
        short = await engine.generate([1, 2], SamplingParams(max_new_tokens=10))
        t_short = time.perf_counter() - t0
        task = asyncio.create_task(engine.generate([3], SamplingParams(max_new_tokens=100)))
        for _ in range(5000):  # bounded wait: 20 tokens into the long request
            if engine.tokens_generated >= 30:
                break
            await asyncio.sleep(0.002)
        await engine.load_weights(1, "ckpt/1")
        t0 = time.perf_counter()
        long = await task
        return short, t_short, long, time.perf_counter() - t0

    short, t_short, long, _ = asyncio.run(run())
    assert len(long.tokens) == 100 and long.finish_reason == "length"
    assert long.versions[0] == 0 and long.versions[-1] == 1 and long.versions == sorted(long.versions)
    assert all(-3.0 <= lp <= -0.01 for lp in short.logprobs)
    assert t_short >= 10 * 2e-3


@pytest.mark.parametrize("kwargs", [dict(seconds_per_token=-1.0),
                                    dict(seconds_per_token=0.0, logprob_range=(-1.0, 0.5)),
                                    dict(seconds_per_token=0.0, chunk_tokens=0)])
def test_bad_settings_refused(kwargs):
    with pytest.raises(ValueError):
        sim.SimulatedEngine(**kwargs)
