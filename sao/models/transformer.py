"""Decoder-only transformer (Qwen3, Qwen3-MoE, Llama) in Flax NNX.

Parameter tree of `Transformer` (paths as `param_paths` prints them, '/'-joined;
logical axes in parentheses; HF name on the right, ``W.T`` = transposed):

  embed/embedding                        [V, D]       (vocab, embed)        model.embed_tokens.weight
  layers/{i}/input_norm/scale            [D]          (None,)               layers.i.input_layernorm.weight
  layers/{i}/attn/q_proj/kernel          [D, H, hd]   (embed, heads, head_dim)     self_attn.q_proj.weight.T reshaped
  layers/{i}/attn/k_proj/kernel          [D, K, hd]   (embed, kv_heads, head_dim)  self_attn.k_proj.weight.T reshaped
  layers/{i}/attn/v_proj/kernel          [D, K, hd]   (embed, kv_heads, head_dim)  self_attn.v_proj.weight.T reshaped
  layers/{i}/attn/{q,k,v}_proj/bias      [N, hd]      only if attention_bias
  layers/{i}/attn/o_proj/kernel          [H, hd, D]   (heads, head_dim, embed)     self_attn.o_proj.weight.T reshaped
  layers/{i}/attn/q_norm/scale           [hd]         qk_norm only          self_attn.q_norm.weight
  layers/{i}/attn/k_norm/scale           [hd]         qk_norm only          self_attn.k_norm.weight
  layers/{i}/post_attn_norm/scale        [D]                                layers.i.post_attention_layernorm.weight
  dense:  layers/{i}/mlp/{gate_proj,up_proj}/kernel [D, F] (embed, mlp); mlp/down_proj/kernel [F, D] (mlp, embed)
  MoE:    layers/{i}/moe/router/kernel [D, E]; moe/experts_gate, moe/experts_up [E, D, Fm];
          moe/experts_down [E, Fm, D]; optional moe/shared_expert/{gate,up,down}_proj/kernel,
          moe/shared_expert_gate/kernel [D, 1]          (see mlp.py)
  final_norm/scale                       [D]                                model.norm.weight
  lm_head/kernel                         [D, V]       (embed, vocab)        lm_head.weight.T (absent if tied)

`ValueModel` (value.py) has the same tree without ``lm_head`` plus
``value_head/kernel [D, 1]`` and ``value_head/bias [1]``.

Block: ``x += attn(input_norm(x)); x += mlp_or_moe(post_attn_norm(x))``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from sao.models.attention import Attention
from sao.models.cache import KVCache
from sao.models.config import ModelConfig
from sao.models.layers import Dense, Embed, RMSNorm
from sao.models.mlp import MLP, MoE
from sao.models.sharding import constrain


class Block(nnx.Module):
    """Pre-norm decoder block."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        kw = dict(dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_param_dtype, rngs=rngs)
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        self.attn = Attention(cfg, rngs=rngs)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        if cfg.is_moe:
            self.moe = MoE(cfg, rngs=rngs)
            self.mlp = None
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, **kw)
            self.moe = None

    def _ffn(self, x):
        h = self.post_attn_norm(x)
        if self.moe is not None:
            y, aux = self.moe(h)
        else:
            y, aux = self.mlp(h), jnp.zeros((), jnp.float32)
        return constrain(x + y, ("batch", "length", "embed")), aux

    def __call__(self, x: jax.Array, positions: jax.Array):
        """x: [B, T, D] -> (x, (k, v), moe_aux_loss)."""
        a, kv = self.attn(self.input_norm(x), positions)
        x = constrain(x + a, ("batch", "length", "embed"))
        x, aux = self._ffn(x)
        return x, kv, aux

    def decode(self, x, positions, k_cache, v_cache):
        """x: [B, 1, D], positions: i32[B] -> (x, k_cache, v_cache)."""
        a, k_cache, v_cache = self.attn.decode(self.input_norm(x), positions, k_cache, v_cache)
        x, _ = self._ffn(x + a)
        return x, k_cache, v_cache


class Decoder(nnx.Module):
    """Embedding, blocks and final norm: the backbone shared by policy and critic."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = Embed(cfg.vocab_size, cfg.hidden_size, dtype=cfg.jnp_dtype,
                           param_dtype=cfg.jnp_param_dtype, rngs=rngs)
        self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=cfg.jnp_dtype,
                                  param_dtype=cfg.jnp_param_dtype, rngs=rngs)

    def _check_tokens(self, tokens):
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be i32[B, T], got shape {tokens.shape}")
        if not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"tokens must be integer, got {tokens.dtype}")

    def forward(self, tokens: jax.Array, positions: jax.Array | None = None):
        """tokens: i32[B, T] -> (hidden [B, T, D] after final norm,
        per-layer [(k, v)] each [B, T, K, hd], moe_aux_loss f32 mean over layers)."""
        self._check_tokens(tokens)
        b, t = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        elif positions.shape != tokens.shape:
            raise ValueError(f"positions shape {positions.shape} != tokens shape {tokens.shape}")
        x = constrain(self.embed(tokens), ("batch", "length", "embed"))
        kvs, aux = [], jnp.zeros((), jnp.float32)
        call = nnx.remat(Block.__call__) if self.cfg.remat else Block.__call__
        for layer in self.layers:
            x, kv, a = call(layer, x, positions)
            kvs.append(kv)
            aux = aux + a
        return self.final_norm(x), kvs, aux / len(self.layers)

    def hidden_states(self, tokens: jax.Array, positions: jax.Array | None = None, *,
                      return_aux: bool = False):
        """tokens: i32[B, T] -> hidden [B, T, D] (compute dtype, after final norm).

        With ``return_aux``: ``(hidden, {"moe_aux_loss": f32 scalar})``, the
        load-balancing loss averaged over layers (0 for dense models).
        Raises ValueError on a non-2-D or non-integer ``tokens``.
        """
        h, _, aux = self.forward(tokens, positions)
        return (h, {"moe_aux_loss": aux}) if return_aux else h

    def decode_hidden(self, tokens: jax.Array, positions: jax.Array, cache: KVCache):
        """One token per row: tokens i32[B, 1], positions i32[B] -> (hidden [B, 1, D], cache)."""
        x = self.embed(tokens)
        ks, vs = [], []
        for layer, kc, vc in zip(self.layers, cache.k, cache.v):
            x, kc, vc = layer.decode(x, positions, kc, vc)
            ks.append(kc)
            vs.append(vc)
        return self.final_norm(x), KVCache(k=tuple(ks), v=tuple(vs))


class Transformer(Decoder):
    """Causal LM. ``model(tokens, positions=None) -> logits f32[B, T, V]``."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        if cfg.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Dense("btd,dv->btv", (cfg.hidden_size, cfg.vocab_size),
                                 ("embed", "vocab"), dtype=jnp.float32,
                                 param_dtype=cfg.jnp_param_dtype, rngs=rngs)

    def head_kernel(self) -> jax.Array:
        """The output projection as f32[D, V] (the embedding transposed if tied)."""
        if self.lm_head is None:
            return self.embed.embedding[...].astype(jnp.float32).T
        return self.lm_head.kernel[...].astype(jnp.float32)

    def logits_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., D] -> logits f32[..., V]: operands in ``cfg.head_dtype``
        (float32 by default), accumulated in float32 (as `token_logprobs`)."""
        hd = jnp.dtype(self.cfg.head_dtype)
        return jnp.einsum("...d,dv->...v", hidden.astype(hd), self.head_kernel().astype(hd),
                          preferred_element_type=jnp.float32)

    def __call__(self, tokens: jax.Array, positions: jax.Array | None = None) -> jax.Array:
        """tokens: i32[B, T] -> logits f32[B, T, V] (materialises [B, T, V];
        use `token_logprobs` for training)."""
        return constrain(self.logits_from_hidden(self.hidden_states(tokens, positions)),
                         ("batch", "length", "vocab"))
