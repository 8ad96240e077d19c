"""Generated wire rows for the trajectory fuzzer (test_fuzz_rows.py).

A row is a valid trajectory message with zero or more *faults* applied: each
field of the ``Trajectory`` message and each metadata key of
``sao.types.METADATA_SCHEMA`` gets wrong types, NaN / inf, huge, empty and
negative values. A fault is either refusing (the row must be dropped) or
neutral (a field the dispatcher overwrites or never reads, a value at the
edge of its range: the row must be trained on). So the expected outcome of
every row is known without re-implementing the checks: accepted exactly when
no refusing fault was applied.
"""
from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import strategies as st

from sao.rpc import codec, sao_pb2
from sao.types import METADATA_SCHEMA, MIN_ROLLOUT_LOGPROB

VOCAB = 272
LEARNER_VERSION = 3
MAX_LENGTH = 64
MAX_ABS_REWARD = 100.0
I32 = np.iinfo(np.int32)

# Reasons a refusal may carry: codec, sao.types.validate, the dispatcher.
REASONS = ({"decode_error", "bad_dtype", "bad_shape", "bad_metadata", "length_mismatch", "empty",
            "too_long", "bad_token_id", "no_action_token", "nonfinite_logprob",
            "positive_logprob", "logprob_out_of_range", "bad_finish", "nonfinite_reward",
            "reward_out_of_range", "future_version", "negative_version", "bad_timing",
            "bad_metadata_drift", "env_error"}
           | {f"bad_metadata_{k}" for k in METADATA_SCHEMA})

huge_ints = st.sampled_from([-(2**63), -(2**31) - 1, -1, 2**31, 2**53 + 1, 2**63 - 1])
nonfinite = st.sampled_from([math.nan, math.inf, -math.inf])
json_junk = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8)
                         | st.floats(allow_nan=False, allow_infinity=False),
                         lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4),
                                                                             c, max_size=3),
                         max_leaves=6)


def _bad_for(key: str) -> st.SearchStrategy:
    """JSON values that ``METADATA_SCHEMA[key]`` refuses."""
    kind, low, high = METADATA_SCHEMA[key]
    common = st.none() | st.lists(st.integers(), max_size=2) | st.just({})
    if kind == "str":
        return common | st.integers() | st.booleans() | st.just("e" * (high + 1))
    out_of_range = (st.integers(max_value=low - 1) | st.integers(min_value=high + 1)
                    | st.floats(min_value=high + 0.5, allow_infinity=False)
                    | st.floats(max_value=low - 0.5, allow_infinity=False))
    if kind == "count":
        return common | st.text(max_size=3) | st.booleans() | out_of_range | st.just(1.5)
    return common | st.text(max_size=3) | out_of_range


def _good_for(key: str) -> st.SearchStrategy:
    kind, low, high = METADATA_SCHEMA[key]
    if kind == "str":
        return st.text(max_size=min(high, 16))
    if kind == "count":
        return st.integers(low, high)
    return st.booleans() | st.floats(low, high)


DRIFT = {"phase": 1, "learner_step": 3, "quality": 1.0, "style_ok": 0}


def base_fields(n_prompt: int, n_action: int) -> dict:
    n = n_prompt + n_action
    return {"tokens": np.arange(n, dtype=np.int64) % 250,
            "action_mask": np.array([False] * n_prompt + [True] * n_action),
            "rollout_logprobs": np.array([0.0] * n_prompt + [-1.0] * n_action),
            "policy_version": np.full(n, LEARNER_VERSION), "reward": 1.0, "finish": "stop",
            "prompt_id": "", "trajectory_id": "", "metadata": {}, "timings": {},
            "epoch": 0, "group": 0, "raw": {}}


def _poke(field: str, value, where: str = "action"):
    def apply(r):
        a = r[field].astype(np.float64 if field == "rollout_logprobs" else object)
        idx = np.flatnonzero(r["action_mask"] if where == "action" else ~r["action_mask"])
        a[idx[-1] if len(idx) else -1] = value
        r[field] = a
    return apply


def _set(field, value):
    def apply(r):
        r[field] = value
    return apply


def _meta(key, value):
    def apply(r):
        r["metadata"][key] = value
    return apply


def _raw(field, msg):
    def apply(r):
        r["raw"][field] = msg
    return apply


def fault(draw, name: str):
    """``(apply(row_fields), refusing)`` for the fault ``name``."""
    d = draw
    refusing = {
        "token_oov": lambda: _poke("tokens", d(st.integers(VOCAB, I32.max))),
        "token_negative": lambda: _poke("tokens", d(st.integers(I32.min, -1))),
        "tokens_int64": lambda: _raw("tokens", sao_pb2.Array(
            dtype="<i8", shape=[2], data=np.array([d(huge_ints)] * 2, np.int64).tobytes())),
        "tokens_empty": lambda: _set("tokens", np.zeros(0, np.int64)),
        "tokens_2d": lambda: _raw("tokens", sao_pb2.Array(dtype="<i4", shape=[2, 2],
                                                           data=bytes(16))),
        "tokens_dtype": lambda: _raw("tokens", sao_pb2.Array(
            dtype=d(st.sampled_from(["<i8", "<f4", "", "|b1", "xx"])), shape=[4], data=bytes(16))),
        "tokens_lying_shape": lambda: _raw("tokens", sao_pb2.Array(
            dtype="<i4", shape=[d(st.integers(-5, 2**40))], data=bytes(d(st.integers(0, 9))))),
        "too_long": lambda: _set("tokens", np.zeros(MAX_LENGTH + d(st.integers(1, 200)),
                                                    np.int64)),
        "mask_none": lambda: (lambda r: r.update(action_mask=np.zeros(len(r["tokens"]), bool))),
        "mask_short": lambda: _set("action_mask", np.array([True])),
        "mask_dtype": lambda: _raw("action_mask", sao_pb2.Array(dtype="<i4", shape=[1],
                                                                data=bytes(4))),
        "logprob_nonfinite": lambda: _poke("rollout_logprobs", d(nonfinite)),
        "logprob_nonfinite_off_mask": lambda: _poke("rollout_logprobs", d(nonfinite), "prompt"),
        "logprob_positive": lambda: _poke("rollout_logprobs", d(st.floats(1e-3, 3e38))),
        "logprob_implausible": lambda: _poke("rollout_logprobs",
                                             d(st.floats(-3e38, MIN_ROLLOUT_LOGPROB - 1e-3))),
        "version_future": lambda: _poke("policy_version", d(st.integers(LEARNER_VERSION + 1,
                                                                        I32.max))),
        "version_negative": lambda: _poke("policy_version", d(st.integers(I32.min, -1))),
        "reward_nonfinite": lambda: _set("reward", d(nonfinite)),
        "reward_huge": lambda: _set("reward", d(st.floats(MAX_ABS_REWARD * 1.01, 1e308))
                                    * d(st.sampled_from([1, -1]))),
        "finish_bad": lambda: _set("finish", d(st.text(max_size=12).filter(
            lambda s: s not in ("stop", "length", "error")))),
        "finish_error": lambda: _set("finish", "error"),
        "metadata_bad_value": lambda: (lambda k: _meta(k, d(_bad_for(k))))(
            d(st.sampled_from(sorted(METADATA_SCHEMA)))),
        "metadata_drift_partial": lambda: (lambda r: r.__setitem__("metadata", {
            k: v for k, v in r["metadata"].items() if k not in DRIFT} | {"phase": 1})),
        "metadata_not_object": lambda: _raw("metadata_json", d(st.sampled_from(
            ["[]", "3", "null", '"s"', "{", "{'a': 1}", '{"a": NaN}', '{"a": 1e999}',
             '{"a": -Infinity}', '{"a":' * 40 + "1" + "}" * 40]))),
        "timing_bad": lambda: _set("timings", {"generate_s": d(
            nonfinite | st.floats(max_value=-1e-9) | st.floats(min_value=1.01e7))}),
    }
    neutral = {
        "ids_text": lambda: (lambda a, b: lambda r: r.update(prompt_id=a, trajectory_id=b))(
            d(st.text(max_size=20)), d(st.text(max_size=20))),
        "epoch_group": lambda: (lambda e, g: lambda r: r.update(epoch=e, group=g))(
            d(st.integers(0, 2**32 - 1)), d(st.integers(0, 2**32 - 1))),
        "metadata_unknown_key": lambda: _meta(d(st.text(max_size=6).filter(
            lambda k: k not in METADATA_SCHEMA)), d(json_junk)),
        "metadata_good_value": lambda: (lambda k: _meta(k, d(_good_for(k))))(
            d(st.sampled_from(sorted(set(METADATA_SCHEMA) - set(DRIFT))))),
        "metadata_drift_complete": lambda: (lambda r: r["metadata"].update(DRIFT)),
        "logprob_at_bound": lambda: _poke("rollout_logprobs", d(st.sampled_from(
            [MIN_ROLLOUT_LOGPROB, 0.0, -0.0]))),
        "reward_at_bound": lambda: _set("reward", d(st.sampled_from(
            [MAX_ABS_REWARD, -MAX_ABS_REWARD, 0.0]))),
        "timing_edge": lambda: _set("timings", {"tool_s": d(st.sampled_from([0.0, 1e7]))}),
        "finish_length": lambda: _set("finish", "length"),
        "longest": lambda: (lambda r: r.update(base_fields(MAX_LENGTH - 4, 4))),
    }
    if name in refusing:
        return refusing[name](), True
    return neutral[name](), False


REFUSING = ["token_oov", "token_negative", "tokens_int64", "tokens_empty", "tokens_2d",
            "tokens_dtype", "tokens_lying_shape", "too_long", "mask_none", "mask_short",
            "mask_dtype", "logprob_nonfinite", "logprob_nonfinite_off_mask", "logprob_positive",
            "logprob_implausible", "version_future", "version_negative", "reward_nonfinite",
            "reward_huge", "finish_bad", "finish_error", "metadata_drift_partial",
            "metadata_not_object", "timing_bad"] + ["metadata_bad_value"] * 4  # 11 keys
NEUTRAL = ["ids_text", "epoch_group", "metadata_unknown_key", "metadata_good_value",
           "metadata_drift_complete", "logprob_at_bound", "reward_at_bound", "timing_edge",
           "finish_length", "longest"]


def build(r: dict) -> bytes:
    """The wire bytes of a row's fields (faults included), each field as given."""
    msg = sao_pb2.Trajectory(reward=float(r["reward"]), finish=r["finish"],
                             prompt_id=r["prompt_id"], trajectory_id=r["trajectory_id"],
                             epoch=r["epoch"], group=r["group"],
                             metadata_json=json.dumps(r["metadata"]))
    for name, dt in codec.FIELD_DTYPES.items():
        a = np.asarray(r[name]).astype(dt)
        getattr(msg, name).CopyFrom(sao_pb2.Array(dtype=dt.str, shape=list(a.shape),
                                                  data=a.tobytes()))
    for k, v in r["timings"].items():
        msg.timings[k] = v
    for field, raw in r["raw"].items():
        if isinstance(raw, sao_pb2.Array):
            getattr(msg, field).CopyFrom(raw)
        else:
            setattr(msg, field, raw)
    return msg.SerializeToString()


@st.composite
def rows(draw) -> tuple[bytes, bool, tuple[str, ...]]:
    """``(wire bytes, must be refused, faults)``; about half the rows are refused."""
    if draw(st.integers(0, 19)) == 0:
        return draw(st.binary(max_size=200)), True, ("garbage",)
    r = base_fields(draw(st.integers(1, 20)), draw(st.integers(1, 20)))
    names = draw(st.lists(st.sampled_from(NEUTRAL), max_size=3))
    if draw(st.booleans()):
        names += draw(st.lists(st.sampled_from(REFUSING), min_size=1, max_size=2))
    refused = False  # neutral faults first ("longest" resizes), so none undoes a refusing one
    for name in sorted(names, key=lambda x: (x in REFUSING, x != "longest", x)):
        apply, refusing = fault(draw, name)
        apply(r)
        refused |= refusing
    return build(r), refused, tuple(names)
