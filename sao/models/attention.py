"""Grouped-query attention with optional qk-norm, RoPE and a KV-cache path.

Parameters (logical axes in parentheses):
  q_proj.kernel [D, H, hd]  (embed, heads, head_dim)
  k_proj.kernel [D, K, hd]  (embed, kv_heads, head_dim)
  v_proj.kernel [D, K, hd]  (embed, kv_heads, head_dim)
  o_proj.kernel [H, hd, D]  (heads, head_dim, embed)
  {q,k,v}_proj.bias [N, hd] only with ``attention_bias``
  q_norm.scale, k_norm.scale [hd] only with ``qk_norm`` (Qwen3)

HF ``q_proj.weight`` is [H*hd, D]: ``kernel = weight.T.reshape(D, H, hd)``;
``o_proj.weight`` [D, H*hd]: ``kernel = weight.T.reshape(H, hd, D)``.
Scores and softmax run in float32; the scale is ``head_dim ** -0.5``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from sao.models.config import ModelConfig
from sao.models.layers import Dense, RMSNorm, rope
from sao.models.mixed import mixed_einsum
from sao.models.sharding import constrain


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """q: [B, T, H, hd]; k, v: [B, S, K, hd]; mask: bool[B, T, S] -> [B, T, H, hd].

    Below float32 (mixed precision) both products are `mixed_einsum`s: bf16
    operands, f32 accumulation, f32 scores, bf16 probabilities and output."""
    b, t, h, hd = q.shape
    kv = k.shape[2]
    q = q.reshape(b, t, kv, h // kv, hd)
    mixed = q.dtype != jnp.float32
    if mixed:
        scores = mixed_einsum("btkgd,bskd->bkgts", q, k, jnp.float32)
    else:
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = scores * (hd ** -0.5)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    if mixed:
        out = mixed_einsum("bkgts,bskd->btkgd", probs, v)
    else:
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, h, hd)


def _attend_causal_chunked(q: jax.Array, k: jax.Array, v: jax.Array, chunk: int) -> jax.Array:
    """Causal attention over query blocks of ``chunk`` (``jax.lax.map`` +
    ``jax.checkpoint``): scores are at most [B, H, chunk, T] at a time, in the
    forward and the backward pass. q: [B, T, H, hd]; k, v: [B, T, K, hd]."""
    b, t, h, hd = q.shape
    pad = (-t) % chunk
    qp = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
    n = (t + pad) // chunk
    blocks = qp.reshape(b, n, chunk, h, hd).swapaxes(0, 1)
    starts = jnp.arange(n) * chunk

    @jax.checkpoint
    def one(args):
        qb, start = args
        rows = start + jnp.arange(chunk)[:, None]
        mask = (jnp.arange(t)[None, :] <= rows)[None]
        return _attend(qb, k, v, mask)

    out = jax.lax.map(one, (blocks, starts))
    return out.swapaxes(0, 1).reshape(b, n * chunk, h, hd)[:, :t]


class Attention(nnx.Module):
    """Causal GQA self-attention (Qwen3 / Llama)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, h, k, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        kw = dict(dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_param_dtype, rngs=rngs)
        bias = cfg.attention_bias
        self.theta = cfg.rope_theta
        self.chunk = cfg.attention_chunk
        self.q_proj = Dense("btd,dhk->bthk", (d, h, hd), ("embed", "heads", "head_dim"),
                            bias_shape=(h, hd) if bias else None,
                            bias_names=("heads", "head_dim"), **kw)
        self.k_proj = Dense("btd,dhk->bthk", (d, k, hd), ("embed", "kv_heads", "head_dim"),
                            bias_shape=(k, hd) if bias else None,
                            bias_names=("kv_heads", "head_dim"), **kw)
        self.v_proj = Dense("btd,dhk->bthk", (d, k, hd), ("embed", "kv_heads", "head_dim"),
                            bias_shape=(k, hd) if bias else None,
                            bias_names=("kv_heads", "head_dim"), **kw)
        self.o_proj = Dense("bthk,hkd->btd", (h, hd, d), ("heads", "head_dim", "embed"), **kw)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype=cfg.jnp_dtype,
                                  param_dtype=cfg.jnp_param_dtype, rngs=rngs)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype=cfg.jnp_dtype,
                                  param_dtype=cfg.jnp_param_dtype, rngs=rngs)
        else:
            self.q_norm = self.k_norm = None

    def _qkv(self, x: jax.Array, positions: jax.Array):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = constrain(rope(q, positions, self.theta), ("batch", "length", "heads", "head_dim"))
        k = constrain(rope(k, positions, self.theta), ("batch", "length", "kv_heads", "head_dim"))
        v = constrain(v, ("batch", "length", "kv_heads", "head_dim"))
        return q, k, v

    def __call__(self, x: jax.Array, positions: jax.Array):
        """Full causal attention over x.

        Args:
          x: [B, T, D]; positions: i32[B, T] (RoPE only; masking is causal by index).
        Returns:
          (out [B, T, D], (k, v) each [B, T, K, hd]) — k/v for filling a cache.
        """
        q, k, v = self._qkv(x, positions)
        t = x.shape[1]
        if self.chunk and t > self.chunk:
            out = _attend_causal_chunked(q, k, v, self.chunk)
        else:
            out = _attend(q, k, v, jnp.tril(jnp.ones((t, t), dtype=bool))[None])
        return self.o_proj(out), (k, v)

    def decode(self, x: jax.Array, positions: jax.Array, k_cache: jax.Array, v_cache: jax.Array):
        """One new token per row against a KV cache.

        Args:
          x: [B, 1, D] hidden of the new token; positions: i32[B], its position
            (= the cache slot written).
          k_cache, v_cache: [B, S, K, hd].
        Returns:
          (out [B, 1, D], k_cache, v_cache) with slot ``positions[b]`` of row b
          overwritten; the token attends to slots ``<= positions[b]``.
        """
        q, k, v = self._qkv(x, positions[:, None])
        slots = jnp.arange(k_cache.shape[1])[None, :]
        write = (slots == positions[:, None])[:, :, None, None]
        k_cache = jnp.where(write, k.astype(k_cache.dtype), k_cache)
        v_cache = jnp.where(write, v.astype(v_cache.dtype), v_cache)
        mask = (slots <= positions[:, None])[:, None, :]
        out = _attend(q, k_cache.astype(q.dtype), v_cache.astype(q.dtype), mask)
        return self.o_proj(out), k_cache, v_cache
