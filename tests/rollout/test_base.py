"""SamplingParams / Completion validation and the scripted engine's engine-like behaviour."""
import asyncio

import pytest

from sao.rollout import Completion, EngineError, SamplingParams, ScriptedEngine, ScriptedTurn


@pytest.mark.parametrize("kwargs", [
    dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_p=0.0), dict(top_p=1.5),
    dict(top_k=-2), dict(max_new_tokens=0), dict(stop_token_ids=(-1,)),
])
def test_sampling_params_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_completion_checks_lengths_and_finish():
    Completion([1, 2], [-0.1, -0.2], [0, 0], "stop")
    with pytest.raises(ValueError, match="lengths differ"):
        Completion([1, 2], [-0.1], [0, 0], "stop")
    with pytest.raises(ValueError, match="finish_reason"):
        Completion([1], [-0.1], [0], "eos")
    with pytest.raises(ValueError, match="at least one"):
        Completion([], [], [], "stop")


def test_scripted_engine_cuts_at_stop_and_length():
    eng = ScriptedEngine([[5, 6, 7, 8], [5, 6, 7, 8], ScriptedTurn([1, 2, 3], swap_to={1: 4})])
    c = asyncio.run(eng.generate([1], SamplingParams(stop_token_ids=(7,))))
    assert (c.tokens, c.finish_reason) == ([5, 6, 7], "stop")
    c = asyncio.run(eng.generate([1], SamplingParams(max_new_tokens=2)))
    assert (c.tokens, c.finish_reason) == ([5, 6], "length")
    c = asyncio.run(eng.generate([1], SamplingParams()))
    assert c.versions == [0, 4, 4] and eng.version == 4
    with pytest.raises(EngineError, match="exhausted"):
        asyncio.run(eng.generate([1], SamplingParams()))
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(eng.generate([], SamplingParams()))
    with pytest.raises(ValueError, match="older"):
        asyncio.run(eng.load_weights(3, "x"))
