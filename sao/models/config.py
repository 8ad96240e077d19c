"""Model configuration (HF config semantics) and named presets.

`ModelConfig` is a frozen dataclass whose fields mean what the same-named
fields of a Hugging Face ``config.json`` mean (``num_layers`` is
``num_hidden_layers``, ``num_heads`` is ``num_attention_heads``,
``num_kv_heads`` is ``num_key_value_heads``, ``num_experts`` /
``num_experts_per_tok`` / ``moe_intermediate_size`` / ``norm_topk_prob`` as in
Qwen3-MoE, ``shared_expert_intermediate_size`` as in Qwen2-MoE).

Presets (`get_preset`): ``tiny`` (byte-level vocab 272, 0.43M params, for
tests and the CPU quick-start), ``tiny-moe`` (the same with 4 routed experts
and a shared expert), ``smollm2-135m``, ``qwen3-0.6b``, ``qwen3-1.7b``,
``qwen3-8b``, ``qwen3-30b-a3b`` (published shapes).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

ARCHS = ("qwen3", "qwen3_moe", "llama")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder-only transformer shape and numerics.

    Attributes:
      arch: "qwen3" (dense, qk-norm), "qwen3_moe" (routed experts, qk-norm) or
        "llama" (dense, no qk-norm).
      vocab_size: V, number of token ids (embedding rows).
      hidden_size: D, residual stream width.
      num_layers: L, decoder blocks.
      num_heads: H, query heads.
      num_kv_heads: K, key/value heads (GQA); must divide H.
      head_dim: hd, width of one head (not necessarily D / H, e.g. Qwen3).
      intermediate_size: F, SwiGLU width of the dense MLP.
      rope_theta: RoPE base θ (HF rotate_half convention, non-interleaved).
      rms_norm_eps: epsilon inside every RMSNorm.
      qk_norm: RMSNorm over head_dim on q and k before RoPE (Qwen3).
      attention_bias: bias on q/k/v projections (off for Qwen3 and Llama).
      tie_word_embeddings: logits use the embedding matrix (no ``lm_head``).
      num_experts: E, routed experts (MoE only; 0 for dense).
      num_experts_per_tok: k of the top-k router (MoE only).
      moe_intermediate_size: width of each routed expert's SwiGLU.
      shared_expert_intermediate_size: width of an always-on shared expert
        with a sigmoid gate (Qwen2-MoE style); 0 = none (Qwen3-MoE).
      norm_topk_prob: renormalise the k selected router probabilities to 1.
      max_position_embeddings: longest supported sequence (informational and
        the default KV-cache bound).
      param_dtype: storage dtype of parameters, "float32" or "bfloat16".
      dtype: compute dtype of activations; log-softmax, norms, router and
        attention softmax always run in float32.
      head_dtype: operand dtype of the LM head's matmul (hidden x head
        kernel), "float32" (default) or "bfloat16"; it accumulates and
        returns float32 logits either way. "bfloat16" rounds both operands
        once (logits within ~1e-2 absolute of float32's on a 48M model) for a
        ~2x cheaper head on bf16 hardware; the sampler and the learner use
        the same head, so the engine's and the learner's log-probs agree.
        Not an HF field.
      attention_chunk: sequences longer than this are attended in query
        blocks of this size (scores [B, H, chunk, T] at a time, recomputed in
        the backward pass); 0 = one block. Same outputs. Not an HF field.
      moe_impl: "dense" (every expert on every token, einsum; shardable over
        the ``expert`` axis) or "ragged" (sorted grouped matmuls with
        ``jax.lax.ragged_dot``: selected experts only). Same outputs.
      remat: recompute each block in the backward pass (``nnx.remat``): less
        activation memory for ~1/3 more compute. Not an HF field.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    arch: str = "qwen3"
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    qk_norm: bool = True
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    max_position_embeddings: int = 4096
    param_dtype: str = "float32"
    dtype: str = "float32"
    head_dtype: str = "float32"
    attention_chunk: int = 1024
    moe_impl: str = "dense"
    remat: bool = False

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={self.num_kv_heads} must divide "
                             f"num_heads={self.num_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.is_moe:
            if not 0 < self.num_experts_per_tok <= self.num_experts:
                raise ValueError("qwen3_moe needs 0 < num_experts_per_tok <= num_experts, got "
                                 f"{self.num_experts_per_tok} / {self.num_experts}")
            if self.moe_intermediate_size <= 0:
                raise ValueError("qwen3_moe needs moe_intermediate_size > 0")
        if self.attention_chunk < 0:
            raise ValueError(f"attention_chunk must be >= 0, got {self.attention_chunk}")
        if self.moe_impl not in ("dense", "ragged"):
            raise ValueError(f"moe_impl must be 'dense' or 'ragged', got {self.moe_impl!r}")
        for name in ("param_dtype", "dtype", "head_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16"):
                raise ValueError(f"{name} must be 'float32' or 'bfloat16', got {getattr(self, name)!r}")

    @property
    def is_moe(self) -> bool:
        return self.arch == "qwen3_moe"

    @property
    def jnp_param_dtype(self):
        return jnp.dtype(self.param_dtype)

    @property
    def jnp_dtype(self):
        return jnp.dtype(self.dtype)

    def replace(self, **changes: Any) -> "ModelConfig":
        """Returns a copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        """Exact parameter count of `Transformer(self)` (embeddings included)."""
        d, hd = self.hidden_size, self.head_dim
        attn = d * hd * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * hd * d
        if self.attention_bias:
            attn += hd * (self.num_heads + 2 * self.num_kv_heads)
        if self.qk_norm:
            attn += 2 * hd
        if self.is_moe:
            mlp = d * self.num_experts + 3 * self.num_experts * d * self.moe_intermediate_size
            if self.shared_expert_intermediate_size:
                mlp += 3 * d * self.shared_expert_intermediate_size + d
        else:
            mlp = 3 * d * self.intermediate_size
        per_layer = attn + mlp + 2 * d
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed + d


_PRESETS: dict[str, ModelConfig] = {
    # Byte-level tokenizer (architecture.md): 256 bytes + specials, padded to 272.
    "tiny": ModelConfig(
        arch="qwen3", vocab_size=272, hidden_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=32, intermediate_size=384, rope_theta=10_000.0,
        tie_word_embeddings=True, max_position_embeddings=2048),
    "tiny-moe": ModelConfig(
        arch="qwen3_moe", vocab_size=272, hidden_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=32, intermediate_size=384, rope_theta=10_000.0,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=96,
        shared_expert_intermediate_size=96, tie_word_embeddings=True,
        max_position_embeddings=2048),
    # HuggingFaceTB/SmolLM2-135M(-Instruct) config.json.
    "smollm2-135m": ModelConfig(
        arch="llama", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9,
        num_kv_heads=3, head_dim=64, intermediate_size=1536, rope_theta=100_000.0,
        rms_norm_eps=1e-5, qk_norm=False, tie_word_embeddings=True,
        max_position_embeddings=8192),
    # Qwen/Qwen3-* config.json files.
    "qwen3-0.6b": ModelConfig(
        arch="qwen3", vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16,
        num_kv_heads=8, head_dim=128, intermediate_size=3072, tie_word_embeddings=True,
        max_position_embeddings=40960, param_dtype="bfloat16", dtype="bfloat16"),
    "qwen3-1.7b": ModelConfig(
        arch="qwen3", vocab_size=151936, hidden_size=2048, num_layers=28, num_heads=16,
        num_kv_heads=8, head_dim=128, intermediate_size=6144, tie_word_embeddings=True,
        max_position_embeddings=40960, param_dtype="bfloat16", dtype="bfloat16"),
    "qwen3-8b": ModelConfig(
        arch="qwen3", vocab_size=151936, hidden_size=4096, num_layers=36, num_heads=32,
        num_kv_heads=8, head_dim=128, intermediate_size=12288, tie_word_embeddings=False,
        max_position_embeddings=40960, param_dtype="bfloat16", dtype="bfloat16"),
    "qwen3-30b-a3b": ModelConfig(
        arch="qwen3_moe", vocab_size=151936, hidden_size=2048, num_layers=48, num_heads=32,
        num_kv_heads=4, head_dim=128, intermediate_size=6144, num_experts=128,
        num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
        tie_word_embeddings=False, max_position_embeddings=40960,
        param_dtype="bfloat16", dtype="bfloat16"),
}

PRESETS: tuple[str, ...] = tuple(_PRESETS)


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """Returns the named preset, optionally with fields overridden.

    Raises:
      KeyError: unknown preset name (the message lists the known ones).
    """
    if name not in _PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    cfg = _PRESETS[name]
    return cfg.replace(**overrides) if overrides else cfg
