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
from sao.models.mixed import product_as_written
from sao.models.sharding import constrain


def _products(q, k, v, mask):
    """Forward: (probs f32[B, K, T, G, S], out [B, T, H, hd] in q's dtype).

    Scores are laid out [B, K, T, G, S]: the products' batch dims (B, K)
    leading and the keys minor, the layout XLA:CPU's matmuls take, so only
    the small [.., hd] operands are copied transposed, never the scores."""
    b, t, h, hd = q.shape
    kv = k.shape[2]
    qg = q.reshape(b, t, kv, h // kv, hd)
    scores = jnp.einsum("btkgd,bskd->bktgs", qg, k.astype(q.dtype),
                        preferred_element_type=jnp.float32) * (hd ** -0.5)
    scores = jnp.where(mask[:, None, :, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    out = product_as_written("bktgs,bskd->bktgd", probs.astype(q.dtype), v.astype(q.dtype))
    return probs, out.transpose(0, 2, 1, 3, 4).astype(q.dtype).reshape(b, t, h, hd)


@jax.custom_vjp
def _attend(q, k, v, mask):
    """q: [B, T, H, hd]; k, v: [B, S, K, hd]; mask: bool[B, T, S] -> [B, T, H, hd].

    Scores, softmax and both products' accumulation in float32; operands in
    q's dtype (bf16 under mixed precision). A custom VJP: the backward pass
    reuses the forward's probabilities and forms the scores' gradient in one
    elementwise pass, ``p * (dp - sum(dout * out))`` (the softmax Jacobian),
    instead of autodiff's chain through max, exp, sum and divide."""
    return _products(q, k, v, mask)[1]


def _attend_fwd(q, k, v, mask):
    probs, out = _products(q, k, v, mask)
    return out, (q, k, v, mask, probs, out)


def _attend_bwd(res, dout):
    q, k, v, mask, probs, out = res
    b, t, h, hd = q.shape
    kv = k.shape[2]
    cd = q.dtype
    g5 = lambda x: x.reshape(b, t, kv, h // kv, hd)
    do = g5(dout.astype(cd))
    dp = jnp.einsum("btkgd,bskd->bktgs", do, v.astype(cd), preferred_element_type=jnp.float32)
    delta = jnp.einsum("btkgd,btkgd->bktg", do.astype(jnp.float32), g5(out).astype(jnp.float32))
    # Masked scores are constants (no gradient): a row with no visible key has
    # uniform probabilities, and without the select would leak into dq and dk.
    ds = jnp.where(mask[:, None, :, None], probs * (dp - delta[..., None]) * (hd ** -0.5), 0)
    ds = ds.astype(cd)
    # Key/value gradients contract over (t, g): formed as [B, K, hd, S], so the
    # small [.., hd] operand gets the transposed copy, not the probabilities.
    dv = product_as_written("btkgd,bktgs->bkds", do, probs.astype(cd)).transpose(0, 3, 1, 2)
    dq = product_as_written("bktgs,bskd->bktgd", ds, k.astype(cd)).transpose(0, 2, 1, 3, 4)
    dk = product_as_written("btkgd,bktgs->bkds", g5(q), ds).transpose(0, 3, 1, 2)
    return (dq.reshape(q.shape).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None)


_attend.defvjp(_attend_fwd, _attend_bwd)


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
