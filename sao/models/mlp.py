"""SwiGLU MLP and the routed mixture of experts (Qwen3-MoE, dense einsum form).

MLP parameters (logical axes):
  gate_proj.kernel [D, F] (embed, mlp);  up_proj.kernel [D, F] (embed, mlp)
  down_proj.kernel [F, D] (mlp, embed)
  HF ``*.weight`` is the transpose (``kernel = weight.T``).

MoE parameters:
  router.kernel       [D, E]      (embed, None)      HF ``mlp.gate.weight.T``
  experts_gate        [E, D, Fm]  (experts, embed, mlp)  HF ``experts.{e}.gate_proj.weight.T`` stacked
  experts_up          [E, D, Fm]  (experts, embed, mlp)
  experts_down        [E, Fm, D]  (experts, mlp, embed)
  shared_expert.{gate_proj,up_proj,down_proj}  an `MLP` of width Fs (optional)
  shared_expert_gate.kernel [D, 1] (embed, None)   sigmoid gate (optional)

Routing (HF Qwen3MoeSparseMoeBlock): ``p = softmax(x @ router)`` in float32,
top-k experts per token, weights renormalised to sum 1 if ``norm_topk_prob``.
Two exact implementations, chosen by ``ModelConfig.moe_impl``:

* ``"dense"`` (default): every expert runs on every token (einsums) and the
  outputs are combined by the (mostly zero) routing weights. Simple, jit- and
  shard-friendly (experts shard on the ``expert`` mesh axis), at E/k times the
  FLOPs and a [B, T, E, Fm] intermediate.
* ``"ragged"``: the N*k (token, expert) pairs are sorted by expert and run
  through grouped matmuls (``jax.lax.ragged_dot``): only the selected experts'
  FLOPs and an [N*k, Fm] intermediate. Single-device/replicated-experts form
  (no all-to-all across an ``expert`` mesh axis).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from sao.models.config import ModelConfig
from sao.models.layers import INIT_STD, Dense
from sao.models.sharding import constrain, param_init


class MLP(nnx.Module):
    """``down(silu(gate(x)) * up(x))``; x: [B, T, D] -> [B, T, D]."""

    def __init__(self, dim: int, hidden: int, *, dtype, param_dtype, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = Dense("btd,df->btf", (dim, hidden), ("embed", "mlp"), **kw)
        self.up_proj = Dense("btd,df->btf", (dim, hidden), ("embed", "mlp"), **kw)
        self.down_proj = Dense("btf,fd->btd", (hidden, dim), ("mlp", "embed"), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.silu(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(constrain(h, ("batch", "length", "mlp")))


def load_balancing_loss(router_probs: jax.Array, expert_index: jax.Array, num_experts: int) -> jax.Array:
    """Switch/HF-style auxiliary loss ``E * sum_e f_e * P_e``.

    Args:
      router_probs: f32[N, E] full softmax router probabilities.
      expert_index: i32[N, k] selected experts.
    Returns:
      f32 scalar; equals k when routing is perfectly uniform (HF
      ``load_balancing_loss_func`` for one layer, no padding mask).
    """
    chosen = jax.nn.one_hot(expert_index, num_experts, dtype=jnp.float32)  # [N, k, E]
    tokens_per_expert = jnp.mean(chosen, axis=0)  # [k, E]
    prob_per_expert = jnp.mean(router_probs, axis=0)  # [E]
    return jnp.sum(tokens_per_expert * prob_per_expert[None]) * num_experts


class MoE(nnx.Module):
    """Top-k routed SwiGLU experts (+ optional gated shared expert)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, e, f = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
        self.dtype = cfg.jnp_dtype
        self.k = cfg.num_experts_per_tok
        self.num_experts = e
        self.norm_topk_prob = cfg.norm_topk_prob
        self.impl = cfg.moe_impl
        pdt = cfg.jnp_param_dtype
        kw = dict(dtype=cfg.jnp_dtype, param_dtype=pdt, rngs=rngs)
        self.router = Dense("btd,de->bte", (d, e), ("embed", None), **kw)
        normal = nnx.initializers.normal(INIT_STD)
        self.experts_gate = nnx.Param(param_init(normal, ("experts", "embed", "mlp"))(
            rngs.params(), (e, d, f), pdt))
        self.experts_up = nnx.Param(param_init(normal, ("experts", "embed", "mlp"))(
            rngs.params(), (e, d, f), pdt))
        self.experts_down = nnx.Param(param_init(normal, ("experts", "mlp", "embed"))(
            rngs.params(), (e, f, d), pdt))
        fs = cfg.shared_expert_intermediate_size
        if fs:
            self.shared_expert = MLP(d, fs, **kw)
            self.shared_expert_gate = Dense("btd,do->bto", (d, 1), ("embed", None), **kw)
        else:
            self.shared_expert = self.shared_expert_gate = None

    def route(self, x: jax.Array):
        """x: [B, T, D] -> (combine f32[B, T, E], probs f32[B, T, E], index i32[B, T, k])."""
        logits = jnp.einsum("btd,de->bte", x.astype(jnp.float32),
                            self.router.kernel[...].astype(jnp.float32))
        probs = jax.nn.softmax(logits, axis=-1)
        top_p, top_i = jax.lax.top_k(probs, self.k)
        if self.norm_topk_prob:
            top_p = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
        combine = jnp.sum(jax.nn.one_hot(top_i, self.num_experts, dtype=jnp.float32)
                          * top_p[..., None], axis=-2)
        return combine, probs, top_i

    def _dense(self, xd, combine, wg, wu, wd):
        h = jax.nn.silu(jnp.einsum("btd,edf->btef", xd, wg)) * jnp.einsum("btd,edf->btef", xd, wu)
        h = constrain(h, ("batch", "length", "experts", "mlp"))
        h = h * combine.astype(self.dtype)[..., None]
        return jnp.einsum("btef,efd->btd", h, wd)

    def _ragged(self, xd, combine, top_i, wg, wu, wd):
        b, t, d = xd.shape
        n, k = b * t, self.k
        expert = top_i.reshape(n * k)
        order = jnp.argsort(expert, stable=True)
        token = order // k  # pair p = token * k + slot
        sizes = jnp.bincount(expert, length=self.num_experts).astype(jnp.int32)
        xs = xd.reshape(n, d)[token]
        h = jax.nn.silu(jax.lax.ragged_dot(xs, wg, sizes)) * jax.lax.ragged_dot(xs, wu, sizes)
        ys = jax.lax.ragged_dot(h, wd, sizes)  # [N*k, D] in expert order
        weight = jnp.take_along_axis(combine.reshape(n, -1), top_i.reshape(n, k), -1).reshape(n * k)
        ys = ys * weight[order].astype(ys.dtype)[:, None]
        return jnp.zeros((n, d), ys.dtype).at[token].add(ys).reshape(b, t, d)

    def __call__(self, x: jax.Array):
        """x: [B, T, D] -> (y [B, T, D], aux_loss f32 scalar)."""
        b, t, _ = x.shape
        combine, probs, top_i = self.route(x)
        xd = x.astype(self.dtype)
        wg = self.experts_gate[...].astype(self.dtype)
        wu = self.experts_up[...].astype(self.dtype)
        wd = self.experts_down[...].astype(self.dtype)
        if self.impl == "ragged":
            y = self._ragged(xd, combine, top_i, wg, wu, wd)
        else:
            y = self._dense(xd, combine, wg, wu, wd)
        if self.shared_expert is not None:
            gate = jax.nn.sigmoid(self.shared_expert_gate(xd))
            y = y + gate * self.shared_expert(xd)
        aux = load_balancing_loss(probs.reshape(b * t, -1), top_i.reshape(b * t, -1),
                                  self.num_experts)
        return y, aux
