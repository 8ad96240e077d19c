"""KV cache: per-layer key/value buffers whose rows are independent.

Slot ``s`` of row ``b`` holds the key/value of the token at position ``s`` of
that row; a decode step at position ``p`` writes slot ``p`` and attends to slots
``<= p``, so slots past a row's length may hold stale values harmlessly. This is
what lets an engine refill one row (`write_cache_row`) while others decode.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh, NamedSharding

from sao.models.config import ModelConfig
from sao.models.sharding import constrain, logical_to_spec


@struct.dataclass
class KVCache:
    """k, v: tuples of L arrays [B, S, K, hd] (batch, slot, kv head, head dim)."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]

    @property
    def batch_size(self) -> int:
        return self.k[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.k[0].shape[1]


CACHE_AXES = ("batch", "length", "kv_heads", "head_dim")


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None, *,
               mesh: Mesh | None = None) -> KVCache:
    """Zeroed cache for ``batch`` rows of up to ``max_len`` tokens.

    Args:
      dtype: storage dtype; defaults to the model's compute dtype.
      mesh: place the buffers sharded by logical axes `CACHE_AXES` (batch
        over data/fsdp, kv heads over tensor); under ``jax.set_mesh`` inside a
        jitted function the same constraint applies without this argument.
    Raises:
      ValueError: non-positive batch or max_len.
    """
    if batch <= 0 or max_len <= 0:
        raise ValueError(f"batch and max_len must be positive, got {batch}, {max_len}")
    dtype = cfg.jnp_dtype if dtype is None else jnp.dtype(dtype)
    shape = (batch, max_len, cfg.num_kv_heads, cfg.head_dim)

    def zeros():
        if mesh is not None:
            spec = logical_to_spec(CACHE_AXES, shape, mesh)
            return jax.device_put(jnp.zeros(shape, dtype), NamedSharding(mesh, spec))
        return constrain(jnp.zeros(shape, dtype), CACHE_AXES)
    return KVCache(k=tuple(zeros() for _ in range(cfg.num_layers)),
                   v=tuple(zeros() for _ in range(cfg.num_layers)))


def fill_cache(cache: KVCache, kvs: list[tuple[jax.Array, jax.Array]]) -> KVCache:
    """Writes per-layer prefill keys/values [B, T, K, hd] into slots [0, T).

    Raises ValueError if T exceeds the cache length or the batch differs.
    """
    t = kvs[0][0].shape[1]
    if t > cache.max_len:
        raise ValueError(f"prompt length {t} exceeds cache max_len {cache.max_len}")
    if kvs[0][0].shape[0] != cache.batch_size:
        raise ValueError(f"batch {kvs[0][0].shape[0]} != cache batch {cache.batch_size}")
    ks = tuple(c.at[:, :t].set(k.astype(c.dtype)) for c, (k, _) in zip(cache.k, kvs))
    vs = tuple(c.at[:, :t].set(v.astype(c.dtype)) for c, (_, v) in zip(cache.v, kvs))
    return KVCache(k=ks, v=vs)


@jax.jit
def _write_row(cache: KVCache, row: jax.Array, row_cache: KVCache) -> KVCache:
    def put(full, one):
        return jax.lax.dynamic_update_slice_in_dim(full, one.astype(full.dtype), row, axis=0)
    return jax.tree.map(put, cache, row_cache)


def write_cache_row(cache: KVCache, row, row_cache: KVCache) -> KVCache:
    """Copies a one-row cache (e.g. from `prefill` on a batch of 1) into row
    ``row`` (int or i32 scalar) of a batch cache; other rows are untouched.

    Shapes: cache [B, S, K, hd] per layer, row_cache [1, S, K, hd].
    Raises:
      ValueError: row_cache is not one row of the same layers/slots/heads.
    """
    full, one = cache.k[0].shape, row_cache.k[0].shape
    if len(cache.k) != len(row_cache.k) or one[0] != 1 or one[1:] != full[1:]:
        raise ValueError(f"row cache {len(row_cache.k)} x {one} does not fit one row of "
                         f"{len(cache.k)} x {full}")
    return _write_row(cache, jnp.asarray(row, jnp.int32), row_cache)
