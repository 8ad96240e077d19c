"""Trajectory <-> wire bytes (packed numpy with explicit dtype and shape).

Every decode failure is a ``CodecError`` whose ``reason`` is a short stable
string (``decode_error``, ``bad_dtype``, ``bad_shape``, ``bad_metadata``),
usable as a metric key next to ``sao.types.validate``'s reasons. Decoding never
trusts sizes from the wire: the byte count must equal shape x itemsize. It
accepts what the encoder would send again: metadata is a JSON object without
``NaN`` / ``Infinity``, nested at most ``MAX_METADATA_DEPTH`` deep, and timings
are finite (``bad_metadata`` otherwise), so a decoded trajectory can always be
encoded again (the dispatcher's checkpointed buffer, replay files).
"""
from __future__ import annotations

import json
import math

import numpy as np
from google.protobuf.message import DecodeError

from sao.rpc import sao_pb2
from sao.types import Trajectory

# Field -> dtype on the wire (little-endian, numpy ``dtype.str``).
FIELD_DTYPES: dict[str, np.dtype] = {
    "tokens": np.dtype("<i4"),
    "action_mask": np.dtype("|b1"),
    "rollout_logprobs": np.dtype("<f4"),
    "policy_version": np.dtype("<i4"),
}
MAX_ARRAY_ELEMENTS = 1 << 26  # 64M tokens: far above any trajectory
# Deeper metadata decodes but cannot be encoded again from a deep call stack
# (json's encoder recurses): a checkpoint of the buffer would raise RecursionError.
MAX_METADATA_DEPTH = 32


class CodecError(ValueError):
    """A wire message that cannot become a Trajectory; ``reason`` is a metric key."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def encode_array(x: np.ndarray, dtype: np.dtype) -> sao_pb2.Array:
    """Packs ``x`` as C-order bytes of ``dtype``; raises ValueError on unsafe casts."""
    x = np.asarray(x)
    if not np.can_cast(x.dtype, dtype, casting="same_kind") and x.size:
        raise ValueError(f"cannot send {x.dtype} as {dtype}")
    a = np.ascontiguousarray(x, dtype=dtype)
    return sao_pb2.Array(dtype=dtype.str, shape=list(a.shape), data=a.tobytes())


def decode_array(msg: sao_pb2.Array, dtype: np.dtype) -> np.ndarray:
    """Unpacks an Array; raises CodecError if dtype, shape or size disagree."""
    if msg.dtype != dtype.str:
        raise CodecError("bad_dtype", f"expected {dtype.str}, got {msg.dtype!r}")
    shape = tuple(int(s) for s in msg.shape)
    if any(s < 0 for s in shape) or math.prod(shape) > MAX_ARRAY_ELEMENTS:
        raise CodecError("bad_shape", f"shape {shape}")
    if len(msg.data) != math.prod(shape) * dtype.itemsize:
        raise CodecError("bad_shape", f"{len(msg.data)} bytes for shape {shape} of {dtype.str}")
    # copy(): the wire buffer is read-only and must not be kept alive.
    return np.frombuffer(msg.data, dtype=dtype).reshape(shape).copy()


def to_proto(traj: Trajectory) -> sao_pb2.Trajectory:
    """Trajectory -> proto message; raises ValueError on non-JSON metadata."""
    return sao_pb2.Trajectory(
        **{name: encode_array(getattr(traj, name), dt) for name, dt in FIELD_DTYPES.items()},
        reward=float(traj.reward), finish=str(traj.finish),
        prompt_id=str(traj.prompt_id), trajectory_id=str(traj.trajectory_id),
        metadata_json=json.dumps(traj.metadata, allow_nan=False),
        timings={str(k): float(v) for k, v in traj.timings.items()},
        epoch=int(traj.epoch), group=int(traj.group))


def _refuse_constant(name: str):
    # json.loads calls this for NaN, Infinity and -Infinity, which the encoder
    # (allow_nan=False) would refuse to send again.
    raise ValueError(f"non-finite number {name} in metadata")


def _finite_float(text: str) -> float:
    x = float(text)  # "1e999" overflows to inf without passing _refuse_constant
    if not math.isfinite(x):
        raise ValueError(f"non-finite number {text} in metadata")
    return x


def _depth(obj) -> int:
    """Nesting depth of a JSON value (iterative: the value may be deep)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        x, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(x, dict):
            stack.extend((v, d + 1) for v in x.values())
        elif isinstance(x, list):
            stack.extend((v, d + 1) for v in x)
    return deepest


def from_proto(msg: sao_pb2.Trajectory) -> Trajectory:
    """Proto message -> Trajectory; raises CodecError. Content checks are
    ``sao.types.validate``'s job (shapes may still disagree between fields)."""
    arrays = {name: decode_array(getattr(msg, name), dt) for name, dt in FIELD_DTYPES.items()}
    try:
        metadata = (json.loads(msg.metadata_json, parse_constant=_refuse_constant,
                                parse_float=_finite_float)
                    if msg.metadata_json else {})
    except (ValueError, RecursionError) as e:
        raise CodecError("bad_metadata", str(e)) from e
    if not isinstance(metadata, dict):
        raise CodecError("bad_metadata", "metadata is not a JSON object")
    if _depth(metadata) > MAX_METADATA_DEPTH:
        raise CodecError("bad_metadata", f"metadata nested deeper than {MAX_METADATA_DEPTH}")
    bad = sorted(k for k, v in msg.timings.items() if not math.isfinite(v))
    if bad:
        raise CodecError("bad_metadata", f"non-finite timings {bad}")
    return Trajectory(**arrays, reward=msg.reward, finish=msg.finish, prompt_id=msg.prompt_id,
                      trajectory_id=msg.trajectory_id, metadata=metadata,
                      timings=dict(msg.timings), epoch=msg.epoch, group=msg.group)


def encode(traj: Trajectory) -> bytes:
    """Trajectory -> serialized bytes (the unit on the wire and in replay files)."""
    return to_proto(traj).SerializeToString()


def decode(data: bytes) -> Trajectory:
    """Serialized bytes -> Trajectory; raises CodecError (reason ``decode_error``
    for bytes that are not a Trajectory message)."""
    msg = sao_pb2.Trajectory()
    try:
        msg.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise CodecError("decode_error", str(e)) from e
    return from_proto(msg)


def try_decode(data: bytes) -> tuple[Trajectory | None, str | None]:
    """Errors as values: ``(trajectory, None)`` or ``(None, reason)``."""
    try:
        return decode(data), None
    except CodecError as e:
        return None, e.reason
