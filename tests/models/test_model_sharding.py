"""Sharding on 8 fake CPU devices: rules table, parameters created sharded,
forward equal to the unsharded model."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from sao import models
from sao.models import (LOGICAL_AXIS_RULES, Transformer, ValueModel, axis_rules, create_sharded,
                        get_preset, logical_to_spec, make_mesh, predict_values, token_logprobs,
                        unsharded_params)

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")


def test_rules_table_dedup_and_divisibility():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    assert logical_to_spec(("embed", "heads", "head_dim"), (128, 4, 32), mesh) == P("fsdp", "tensor", None)
    # batch takes (data, fsdp); embed then cannot reuse fsdp in the same array.
    assert logical_to_spec(("batch", "length", "embed"), (8, 16, 128), mesh) == P(("data", "fsdp"), None, None)
    # 9 heads do not split over tensor=2: replicated instead of failing.
    assert logical_to_spec(("embed", "heads", "head_dim"), (576, 9, 64), mesh) == P("fsdp", None, None)
    # the expert axis has size 1 here: dropped.
    assert logical_to_spec(("experts", "embed", "mlp"), (4, 128, 96), mesh) == P(None, "fsdp", "tensor")
    custom = tuple((k, None if k == "embed" else v) for k, v in LOGICAL_AXIS_RULES)
    with axis_rules(custom):
        assert logical_to_spec(("embed", "mlp"), (128, 384), mesh) == P(None, "tensor")
    assert logical_to_spec(("embed",), (128,), mesh) == P("fsdp")  # default restored
    # batch 2 fits data=2 but not data*fsdp=4: the longest dividing prefix is kept.
    assert logical_to_spec(("batch",), (2,), mesh) == P("data")
    with pytest.raises(ValueError, match="no rule"):
        logical_to_spec(("bogus",), (4,), mesh)
    with pytest.raises(ValueError, match="devices"):
        make_mesh(data=3)


@pytest.mark.parametrize("preset,axes", [("tiny", dict(data=2, fsdp=2, tensor=2)),
                                         ("tiny-moe", dict(fsdp=2, tensor=2, expert=2))])
def test_created_sharded_and_forward_matches(preset, axes):
    cfg = get_preset(preset, num_layers=1)
    mesh = make_mesh(**axes)
    sharded = create_sharded(lambda: Transformer(cfg, rngs=nnx.Rngs(0)), mesh)
    plain = Transformer(cfg, rngs=nnx.Rngs(0))
    assert unsharded_params(sharded, mesh, min_size=4096) == []
    q = sharded.layers[0].attn.q_proj.kernel.get_value()
    assert q.sharding.spec == P("fsdp", "tensor", None)
    assert q.addressable_shards[0].data.shape == (cfg.hidden_size // 2, cfg.num_heads // 2, cfg.head_dim)
    if cfg.is_moe:
        assert sharded.layers[0].moe.experts_up.get_value().sharding.spec == P("expert", "fsdp", "tensor")
    # Same initialisation as an eager build (up to the last bit of jitted sampling).
    for a, b in zip(jax.tree.leaves(nnx.state(sharded)), jax.tree.leaves(nnx.state(plain))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    # The forward on the mesh equals the forward of the same numbers on one device.
    graphdef, state = nnx.split(sharded)
    plain = nnx.merge(graphdef, jax.device_put(state, jax.devices()[0]))

    tokens = jax.random.randint(jax.random.key(0), (4, 12), 0, cfg.vocab_size)
    fn = nnx.jit(lambda m, t: token_logprobs(m, t, chunk=4))
    expected = fn(plain, tokens)
    with jax.set_mesh(mesh):
        tokens_sh = jax.device_put(tokens, NamedSharding(mesh, logical_to_spec(("batch", "length"), tokens.shape, mesh)))
        got = fn(sharded, tokens_sh)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert len(got.sharding.device_set) == 8


@pytest.fixture(scope="module")
def tiny_on_mesh():
    cfg = get_preset("tiny", num_layers=1)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    return cfg, mesh, create_sharded(lambda: Transformer(cfg, rngs=nnx.Rngs(0)), mesh)


def test_critic_from_sharded_policy_keeps_sharding(tiny_on_mesh):
    cfg, mesh, policy = tiny_on_mesh
    critic = ValueModel.from_policy(policy)
    emb = critic.embed.embedding.get_value()
    assert emb.sharding.spec == P("tensor", "fsdp")
    with jax.set_mesh(mesh):
        values = nnx.jit(predict_values)(critic, jnp.ones((4, 6), jnp.int32))
    np.testing.assert_array_equal(values, 0.0)


def test_generate_on_a_mesh_matches_one_device(tiny_on_mesh):
    cfg, mesh, sharded = tiny_on_mesh
    graphdef, state = nnx.split(sharded)
    plain = nnx.merge(graphdef, jax.device_put(state, jax.devices()[0]))
    prompts = jnp.array([[257, 5, 6, 0], [257, 7, 0, 0], [257, 8, 9, 10], [257, 1, 2, 3]])
    lengths = jnp.array([3, 2, 4, 4])
    kw = dict(rng=jax.random.key(0), max_new_tokens=5, temperature=0.0)
    expected = models.generate(plain, prompts, lengths, **kw)
    with jax.set_mesh(mesh):
        got = models.generate(sharded, prompts, lengths, **kw)
    np.testing.assert_array_equal(got.tokens, expected.tokens)
    np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=1e-5)
    cache = models.init_cache(cfg, 4, 8, mesh=mesh)
    assert cache.k[0].sharding.spec == P(("data", "fsdp"), None, "tensor", None)
