import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from sao.rpc import codec
from sao.types import Trajectory


def traj(n=5, **kw):
    base = dict(tokens=np.arange(n) % 200, action_mask=np.arange(n) % 2 == 1,
                rollout_logprobs=-np.linspace(0, 1, n) * (np.arange(n) % 2),
                policy_version=np.arange(n) // 2, reward=0.5, finish="stop",
                prompt_id="p1", trajectory_id="t1", metadata={"task": "x", "n": [1, 2]},
                timings={"generate_s": 0.25})
    base.update(kw)
    return Trajectory(**base)


def assert_same(a: Trajectory, b: Trajectory):
    for name, dtype in codec.FIELD_DTYPES.items():
        x, y = getattr(a, name), getattr(b, name)
        assert y.dtype == dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)
    assert (a.reward, a.finish, a.prompt_id, a.trajectory_id, a.metadata, a.timings) == \
        (b.reward, b.finish, b.prompt_id, b.trajectory_id, b.metadata, b.timings)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 300), reward=st.floats(allow_nan=False), seed=st.integers(0, 2**16),
       finish=st.sampled_from(["stop", "length", "error"]))
def test_roundtrip_is_exact(n, reward, seed, finish):
    rng = np.random.default_rng(seed)
    t = Trajectory(tokens=rng.integers(0, 2**31 - 1, n), action_mask=rng.random(n) < 0.5,
                   rollout_logprobs=-rng.exponential(size=n).astype(np.float32),
                   policy_version=rng.integers(0, 100, n), reward=reward, finish=finish,
                   prompt_id=f"p{seed}", trajectory_id="ü-ß", metadata={"seed": seed})
    assert_same(t, codec.decode(codec.encode(t)))


def test_arrays_keep_dtype_shape_and_bytes():
    msg = codec.to_proto(traj(4))
    assert msg.tokens.dtype == "<i4" and list(msg.tokens.shape) == [4]
    assert len(msg.tokens.data) == 16 and len(msg.action_mask.data) == 4
    assert msg.rollout_logprobs.dtype == "<f4"


@pytest.mark.parametrize("mutate,reason", [
    (lambda m: setattr(m.tokens, "dtype", "<i8"), "bad_dtype"),
    (lambda m: m.tokens.shape.__setitem__(0, 5), "bad_shape"),
    (lambda m: setattr(m.rollout_logprobs, "data", m.rollout_logprobs.data[:-1]), "bad_shape"),
    (lambda m: m.policy_version.shape.__setitem__(0, -1), "bad_shape"),
    (lambda m: m.tokens.shape.append(2**40), "bad_shape"),
    (lambda m: setattr(m, "metadata_json", "[1, 2]"), "bad_metadata"),
    (lambda m: setattr(m, "metadata_json", "{not json"), "bad_metadata"),
])
def test_bad_messages_raise_codec_error_with_reason(mutate, reason):
    msg = codec.to_proto(traj(4))
    mutate(msg)
    t, got = codec.try_decode(msg.SerializeToString())
    assert t is None and got == reason


def test_length_mismatch_between_fields_is_left_to_validate():
    from sao.types import validate
    msg = codec.to_proto(traj(4))
    msg.action_mask.CopyFrom(codec.encode_array(np.ones(3, bool), np.dtype("|b1")))
    t = codec.decode(msg.SerializeToString())
    assert validate(t, vocab_size=272) == "length_mismatch"


def test_unsafe_cast_refused():
    with pytest.raises(ValueError, match="cannot send"):
        codec.encode_array(np.array([0.5]), np.dtype("<i4"))


def test_nonjson_metadata_refused():
    with pytest.raises(ValueError):
        codec.encode(traj(3, metadata={"x": math.nan}))


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes_never_crash(data):
    t, reason = codec.try_decode(data)
    assert (t is None) != (reason is None)
    assert reason in (None, "decode_error", "bad_dtype", "bad_shape", "bad_metadata")


@settings(max_examples=200, deadline=None)
@given(pos=st.integers(0, 10_000), byte=st.integers(0, 255))
def test_flipped_bytes_of_a_real_message_never_crash(pos, byte):
    data = bytearray(codec.encode(traj(20)))
    data[pos % len(data)] = byte
    t, reason = codec.try_decode(bytes(data))
    assert (t is None) != (reason is None)


@pytest.mark.parametrize("metadata_json", [
    '{"score": NaN}', '{"score": Infinity}', '{"score": [-Infinity]}', '{"score": 1e999}',
    '{"a": ' * 33 + '1' + '}' * 33,
])
def test_metadata_the_encoder_would_refuse_is_bad_metadata(metadata_json):
    # The dispatcher re-encodes buffered trajectories at every checkpoint: what it
    # decodes must encode again (NaN used to decode, then crash state_dict()).
    msg = codec.to_proto(traj(4))
    msg.metadata_json = metadata_json
    t, reason = codec.try_decode(msg.SerializeToString())
    assert t is None and reason == "bad_metadata"


def test_deepest_allowed_metadata_round_trips():
    deep = {}
    for _ in range(codec.MAX_METADATA_DEPTH - 1):
        deep = {"a": deep}
    t = codec.decode(codec.encode(traj(4, metadata=deep)))
    assert t.metadata == deep


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_timing_is_bad_metadata(bad):
    msg = codec.to_proto(traj(4))
    msg.timings["generate_s"] = bad
    assert codec.try_decode(msg.SerializeToString()) == (None, "bad_metadata")


@settings(max_examples=200, deadline=None)
@given(pos=st.integers(0, 10_000), byte=st.integers(0, 255),
       metadata=st.sampled_from(['{"x": 1.5}', '{"x": NaN}', '{"x": -1e400}', '[]', '{"x": "ü"}']))
def test_whatever_decodes_encodes_again(pos, byte, metadata):
    msg = codec.to_proto(traj(20))
    msg.metadata_json = metadata
    data = bytearray(msg.SerializeToString())
    data[pos % len(data)] = byte
    t, reason = codec.try_decode(bytes(data))
    if t is not None:
        assert codec.decode(codec.encode(t)).metadata == t.metadata
