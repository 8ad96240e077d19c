"""HF format: import(export(x)) is exact; sharded checkpoints; clear errors."""
import json
import os

import ml_dtypes
import numpy as np
import pytest

from sao.models import from_pretrained, hf
from sao.models.config import ModelConfig
from sao.models.tokenizer import ByteTokenizer

_SHAPE = dict(vocab_size=272, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
              head_dim=8, intermediate_size=48, rope_theta=10_000.0)
CONFIGS = {
    "qwen3": ModelConfig(arch="qwen3", **_SHAPE),
    "qwen3_moe": ModelConfig(arch="qwen3_moe", num_experts=3, num_experts_per_tok=2,
                             moe_intermediate_size=16, norm_topk_prob=False, **_SHAPE),
    "llama": ModelConfig(arch="llama", qk_norm=False, tie_word_embeddings=True, **_SHAPE),
}
HF_NAMES = {"qwen3": ("Qwen3ForCausalLM", "qwen3"),
            "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
            "llama": ("LlamaForCausalLM", "llama")}


def assert_same_params(a, b):
    pa, pb = hf.model_params(a), hf.model_params(b)
    assert sorted(pa, key=str) == sorted(pb, key=str)
    for path in pa:
        assert pa[path].dtype == pb[path].dtype, path
        np.testing.assert_array_equal(pa[path], pb[path], err_msg=str(path))


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_round_trip_is_exact(arch, tmp_path):
    cfg = CONFIGS[arch]
    model = hf.build_model(cfg, hf.random_params(cfg, 3))
    hf.save_pretrained(model, cfg, str(tmp_path), tokenizer=ByteTokenizer())
    with open(tmp_path / "config.json") as f:
        hf_cfg = json.load(f)
    assert (hf_cfg["architectures"][0], hf_cfg["model_type"]) == HF_NAMES[arch]
    assert hf_cfg["eos_token_id"] == 258
    cfg2, model2, tok = from_pretrained(str(tmp_path))
    assert cfg2 == cfg
    assert_same_params(model, model2)
    assert tok.encode("<answer>1</answer>") == [263, 49, 264]


def test_sharded_checkpoint(tmp_path):
    cfg = CONFIGS["qwen3_moe"]
    model = hf.build_model(cfg, hf.random_params(cfg, 4))
    hf.save_pretrained(model, cfg, str(tmp_path), max_shard_bytes=40_000)
    index = json.loads((tmp_path / hf.SAFETENSORS_INDEX).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and not (tmp_path / hf.SAFETENSORS).exists()
    assert all((tmp_path / s).exists() for s in shards)
    assert "model.layers.1.mlp.experts.2.down_proj.weight" in index["weight_map"]
    cfg2, model2, tok = from_pretrained(str(tmp_path))
    assert cfg2 == cfg and tok is None
    assert_same_params(model, model2)


def test_bfloat16_round_trip_and_dtype_option(tmp_path):
    cfg = CONFIGS["qwen3"].replace(param_dtype="bfloat16", dtype="bfloat16")
    model = hf.build_model(cfg, hf.random_params(cfg, 5))
    hf.save_pretrained(model, cfg, str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    state = hf.load_hf_state(str(tmp_path))
    assert state["model.norm.weight"].dtype == ml_dtypes.bfloat16
    cfg2, model2, _ = from_pretrained(str(tmp_path), dtype="bfloat16")
    assert cfg2 == cfg
    assert_same_params(model, model2)
    _, model32, _ = from_pretrained(str(tmp_path))  # default float32: exact upcast
    w32 = hf.model_params(model32)[("embed", "embedding")]
    assert w32.dtype == np.float32
    np.testing.assert_array_equal(w32, hf.model_params(model)[("embed", "embedding")]
                                  .astype(np.float32))


def test_weight_map_layouts():
    cfg = CONFIGS["qwen3"]
    rng = np.random.default_rng(0)
    q = rng.normal(size=(cfg.num_heads * cfg.head_dim, cfg.hidden_size)).astype(np.float32)
    entry = {n: (p, f) for n, p, f, _ in hf.weight_map(cfg)}["model.layers.0.self_attn.q_proj.weight"]
    kernel = entry[1](q)
    assert entry[0] == ("layers", 0, "attn", "q_proj", "kernel")
    # kernel[d, h, k] is row h*hd + k, column d of the HF weight.
    assert kernel[5, 2, 3] == q[2 * cfg.head_dim + 3, 5]


def test_errors(tmp_path):
    cfg = CONFIGS["qwen3"]
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(str(tmp_path))
    model = hf.build_model(cfg, hf.random_params(cfg, 0))
    hf.save_pretrained(model, cfg, str(tmp_path))
    state = hf.load_hf_state(str(tmp_path))
    del state["model.layers.1.mlp.up_proj.weight"]
    state["model.layers.9.extra"] = np.zeros(1)
    with pytest.raises(ValueError, match=r"missing \['model.layers.1.mlp.up_proj.weight'\], "
                                         r"unexpected \['model.layers.9.extra'\]"):
        hf.params_from_hf(cfg, state)
    tied = CONFIGS["llama"]
    bad = hf.params_to_hf(tied, hf.random_params(tied, 0))
    bad["lm_head.weight"] = bad["model.embed_tokens.weight"] + 1
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        hf.params_from_hf(tied, bad)
    wrong = hf.params_to_hf(tied, hf.random_params(tied, 0))
    wrong["model.layers.1.self_attn.k_proj.weight"] = np.zeros((5, tied.hidden_size), np.float32)
    with pytest.raises(ValueError, match=r"k_proj.weight: shape \(5, 32\)"):
        hf.params_from_hf(tied, wrong)
    good = hf.params_to_hf(tied, hf.random_params(tied, 0))
    good["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)
    assert len(hf.params_from_hf(tied, good)) == len(hf.param_shapes(tied))
    hf_cfg = hf.config_to_hf(cfg)
    with pytest.raises(ValueError, match="model_type"):
        hf.config_from_hf({**hf_cfg, "model_type": "gpt2"})
    with pytest.raises(ValueError, match="RoPE scaling"):
        hf.config_from_hf({**hf_cfg, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="attention_bias"):
        hf.config_from_hf({**hf_cfg, "attention_bias": True})
    with pytest.raises(ValueError, match="dtype"):
        hf.config_from_hf(hf_cfg, dtype="float16")
    with pytest.raises(ValueError, match="shared expert"):
        hf.config_to_hf(CONFIGS["qwen3_moe"].replace(shared_expert_intermediate_size=8))
    with pytest.raises(ValueError, match="qk-norm"):
        hf.config_to_hf(CONFIGS["llama"].replace(qk_norm=True))
    with pytest.raises(ValueError, match="shape"):
        params = hf.model_params(model)
        params[("final_norm", "scale")] = np.ones(3, np.float32)
        hf.build_model(cfg, params)


def test_transformers_v5_config_keys():
    hf_cfg = hf.config_to_hf(CONFIGS["qwen3_moe"])
    v5 = {k: v for k, v in hf_cfg.items() if k not in ("rope_theta", "num_experts")}
    v5.update(rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
              num_local_experts=3)
    assert hf.config_from_hf(v5) == CONFIGS["qwen3_moe"]
    assert os.path.basename(hf.SAFETENSORS) == "model.safetensors"


def test_load_onto_a_mesh(tmp_path):
    import jax

    from sao.models.sharding import make_mesh

    cfg = CONFIGS["qwen3"]
    model = hf.build_model(cfg, hf.random_params(cfg, 6))
    hf.save_pretrained(model, cfg, str(tmp_path))
    mesh = make_mesh(fsdp=2, tensor=4, devices=jax.devices()[:8])
    _, sharded, _ = from_pretrained(str(tmp_path), mesh=mesh)
    q = sharded.layers[0].attn.q_proj.kernel[...]
    assert q.sharding.mesh.shape == mesh.shape
    assert not q.sharding.is_fully_replicated
    assert_same_params(model, sharded)
