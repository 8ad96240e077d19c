"""Presets: full-size shapes checked with eval_shape only; parameter counts
against published sizes."""
import jax
import numpy as np
import pytest
from flax import nnx

from sao.models import PRESETS, Transformer, ValueModel, get_preset, param_paths

# Published totals (embeddings included).
PUBLISHED = {
    "smollm2-135m": 134.5e6,
    "qwen3-0.6b": 0.596e9,   # Qwen3-0.6B: 0.6B total, 0.44B non-embedding
    "qwen3-1.7b": 1.72e9,
    "qwen3-8b": 8.19e9,
    "qwen3-30b-a3b": 30.5e9,
}


def _count(abstract_model) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract_model, nnx.Param)))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_full_size_shapes_and_counts(name):
    cfg = get_preset(name)
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    n = _count(abstract)
    assert n == cfg.num_params()
    assert abs(n - PUBLISHED[name]) / PUBLISHED[name] < 0.03, (name, n)
    layer = abstract.layers[0]
    assert layer.attn.q_proj.kernel.shape == (cfg.hidden_size, cfg.num_heads, cfg.head_dim)
    assert layer.attn.o_proj.kernel.shape == (cfg.num_heads, cfg.head_dim, cfg.hidden_size)
    assert (abstract.lm_head is None) == cfg.tie_word_embeddings
    if cfg.is_moe:
        assert layer.moe.experts_down.shape == (cfg.num_experts, cfg.moe_intermediate_size,
                                                cfg.hidden_size)
    assert layer.attn.q_proj.kernel.dtype == cfg.jnp_param_dtype


def test_qwen3_30b_active_params():
    cfg = get_preset("qwen3-30b-a3b")
    expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size * cfg.num_layers
    active = cfg.num_params() - (cfg.num_experts - cfg.num_experts_per_tok) * expert
    assert 3.0e9 < active < 3.6e9  # "A3B": 3.3B activated


def test_tiny_presets_are_small_and_all_presets_build():
    tiny = get_preset("tiny")
    assert tiny.vocab_size == 272 and tiny.num_params() <= 2_000_000
    assert tiny.num_heads == 4 and tiny.num_kv_heads == 2 and tiny.head_dim == 32
    assert set(PUBLISHED) | {"tiny", "tiny-moe"} == set(PRESETS)
    assert get_preset("tiny", num_layers=3).num_layers == 3


def test_value_model_tree_is_policy_tree_plus_head():
    cfg = get_preset("qwen3-8b")
    policy = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    critic = nnx.eval_shape(lambda: ValueModel(cfg, rngs=nnx.Rngs(0)))
    p, c = set(param_paths(policy)), set(param_paths(critic))
    assert p - c == {"lm_head/kernel"}
    assert c - p == {"value_head/kernel", "value_head/bias"}
