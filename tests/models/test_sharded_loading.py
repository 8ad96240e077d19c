"""Sharded loading on 8 fake devices: every parameter of a HF / GGUF checkpoint
lands on the mesh with the sharding its rule names, straight from the host
(no whole tensor on one device); the critic made from the sharded policy."""
import jax
import numpy as np
import pytest
from flax import nnx

from sao.models import ValueModel, from_pretrained, gguf_io, hf
from sao.models.config import ModelConfig
from sao.models.sharding import logical_to_spec, make_mesh
from sao.models.tokenizer import ByteTokenizer

_SHAPE = dict(vocab_size=272, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
              head_dim=8, intermediate_size=48, rope_theta=10_000.0)
CONFIGS = {
    "qwen3": ModelConfig(arch="qwen3", **_SHAPE),
    "qwen3_moe": ModelConfig(arch="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                             moe_intermediate_size=16, **_SHAPE),
}


def _flat(model):
    return {"/".join(map(str, p)): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def assert_rule_shardings(model, mesh):
    """Each parameter's sharding is its logical names' spec on ``mesh``, and each
    device holds only its shard."""
    n_split = 0
    for path, var in _flat(model).items():
        value = var.get_value()
        names = var.get_metadata().get("out_sharding")
        want = logical_to_spec(names, value.shape, mesh)
        assert value.sharding.mesh.shape == mesh.shape, path
        assert value.sharding.spec == want, (path, value.sharding.spec, want)
        shard_shape = value.sharding.shard_shape(value.shape)
        assert all(s.data.shape == shard_shape for s in value.addressable_shards), path
        n_split += shard_shape != value.shape
    return n_split


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_hf_checkpoint_lands_sharded(arch, tmp_path, monkeypatch):
    cfg = CONFIGS[arch]
    params = hf.random_params(cfg, 1)
    hf.save_pretrained(hf.build_model(cfg, params), cfg, str(tmp_path))
    mesh = make_mesh(fsdp=2, tensor=2, expert=2, devices=jax.devices()[:8])
    with monkeypatch.context() as m:
        m.setattr(hf.jnp, "asarray", _refuse)
        _, model, _ = from_pretrained(str(tmp_path), mesh=mesh)
    assert assert_rule_shardings(model, mesh) >= 10
    loaded = hf.model_params(model)
    for path, want in params.items():
        np.testing.assert_array_equal(loaded[path], want, err_msg=str(path))
    if cfg.is_moe:   # experts over the expert axis
        spec = model.layers[0].moe.experts_gate[...].sharding.spec
        assert spec[0] == "expert"


def test_gguf_lands_sharded_and_bf16(tmp_path, monkeypatch):
    cfg = ModelConfig(arch="llama", qk_norm=False, **_SHAPE)
    model = hf.build_model(cfg, hf.random_params(cfg, 2))
    path = str(tmp_path / "m.gguf")
    gguf_io.write_gguf(model, cfg, path, ByteTokenizer())
    mesh = make_mesh(data=2, fsdp=4, devices=jax.devices()[:8])
    with monkeypatch.context() as m:
        m.setattr(hf.jnp, "asarray", _refuse)
        _, sharded, _ = from_pretrained(path, dtype="bfloat16", mesh=mesh)
    assert assert_rule_shardings(sharded, mesh) >= 5
    q = sharded.layers[0].attn.q_proj.kernel[...]
    assert q.dtype == jax.numpy.bfloat16
    np.testing.assert_array_equal(np.asarray(q), np.asarray(
        model.layers[0].attn.q_proj.kernel[...]).astype(jax.numpy.bfloat16))


def test_critic_from_sharded_policy(tmp_path):
    cfg = CONFIGS["qwen3"]
    hf.save_pretrained(hf.build_model(cfg, hf.random_params(cfg, 4)), cfg, str(tmp_path))
    mesh = make_mesh(fsdp=4, tensor=2, devices=jax.devices()[:8])
    _, policy, _ = from_pretrained(str(tmp_path), mesh=mesh)
    critic = ValueModel.from_policy(policy)
    assert assert_rule_shardings(critic, mesh) >= 10
    head = critic.value_head.kernel[...]
    assert head.sharding.spec == logical_to_spec(("embed", None), head.shape, mesh)
    assert not np.any(np.asarray(head))
    p, c = _flat(policy), _flat(critic)
    assert set(c) - set(p) == {"value_head/kernel", "value_head/bias"}
    for k in set(c) & set(p):
        np.testing.assert_array_equal(np.asarray(c[k].get_value()), np.asarray(p[k].get_value()))


def _refuse(*args, **kwargs):
    raise AssertionError("whole tensor placed on one device")
