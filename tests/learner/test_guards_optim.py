"""Non-finite guard, freezing / weight-decay masks, shard check (no model: fast)."""
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from sao.learner.guards import check_sharded
from sao.learner.mesh import mesh_from_config
from sao.learner.state import TrainState, decay_mask, make_optimizer, trainable_mask
from sao.learner.steps import apply_update


def _params():
    return {"embed": {"embedding": jnp.ones((4, 3))},
            "layers": {0: {"attn": {"q_proj": {"kernel": jnp.full((3, 3), 0.5)}},
                           "mlp": {"up_proj": {"kernel": jnp.full((3, 2), 0.5)}},
                           "input_norm": {"scale": jnp.ones((3,))}}}}


def _state(tx, params):
    return TrainState(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32))


def test_masks():
    p = _params()
    decay = decay_mask(p)
    assert not decay["embed"]["embedding"] and not decay["layers"][0]["input_norm"]["scale"]
    assert decay["layers"][0]["mlp"]["up_proj"]["kernel"]
    train = trainable_mask(p, r"^layers/\d+/attn/")
    assert not train["layers"][0]["attn"]["q_proj"]["kernel"]
    assert train["layers"][0]["mlp"]["up_proj"]["kernel"] and train["embed"]["embedding"]


def test_frozen_params_bit_identical_and_decay_masked():
    p = _params()
    tx = make_optimizer(p, lr=0.1, weight_decay=0.5, freeze_regex=r"/attn/")
    trainable = trainable_mask(p, r"/attn/")
    state = _state(tx, p)
    grads = jax.tree.map(lambda x: jnp.full(x.shape, 3.0), p)
    update = jax.jit(lambda s, g: apply_update(s, g, jnp.float32(1.0), tx, trainable))
    for _ in range(3):
        state, m = update(state, grads)
    attn = state.params["layers"][0]["attn"]["q_proj"]["kernel"]
    np.testing.assert_array_equal(np.asarray(attn), np.full((3, 3), 0.5, np.float32))
    assert not np.allclose(state.params["layers"][0]["mlp"]["up_proj"]["kernel"], 0.5)
    assert int(state.step) == 3
    # grad norm is over trainable leaves only: 4*3 + 3*2 + 3 = 21 entries of 3.0
    np.testing.assert_allclose(float(m["grad_norm"]), 3.0 * np.sqrt(21), rtol=1e-6)
    # with zero gradient only weight decay acts: the 2-D kernel shrinks, embedding/norm do not
    tx2 = make_optimizer(p, lr=0.1, weight_decay=0.5)
    s2, _ = apply_update(_state(tx2, p), jax.tree.map(jnp.zeros_like, p), jnp.float32(0.0),
                         tx2, trainable_mask(p, ""))
    assert float(s2.params["layers"][0]["mlp"]["up_proj"]["kernel"][0, 0]) < 0.5
    np.testing.assert_array_equal(s2.params["embed"]["embedding"], p["embed"]["embedding"])
    np.testing.assert_array_equal(s2.params["layers"][0]["input_norm"]["scale"],
                                  p["layers"][0]["input_norm"]["scale"])


@pytest.mark.parametrize("bad", ["loss", "grad"])
def test_nonfinite_update_is_skipped(bad):
    p = _params()
    tx = make_optimizer(p, lr=0.1)
    state = _state(tx, p)
    grads = jax.tree.map(jnp.ones_like, p)
    loss = jnp.float32(1.0)
    if bad == "loss":
        loss = jnp.float32(jnp.nan)
    else:
        grads["layers"][0]["mlp"]["up_proj"]["kernel"] = grads["layers"][0]["mlp"]["up_proj"][
            "kernel"].at[0, 0].set(jnp.inf)
    new, m = apply_update(state, grads, loss, tx, trainable_mask(p, ""))
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(m["skipped_nonfinite_loss"]) == (bad == "loss")
    assert float(m["skipped_nonfinite_grad"]) == (bad == "grad")


def test_check_sharded_names_the_replicated_param(caplog):
    mesh = mesh_from_config({"data": 2, "fsdp": 2, "tensor": 2})
    big = jax.device_put(jnp.zeros((64, 64)), NamedSharding(mesh, PartitionSpec()))
    split = jax.device_put(jnp.zeros((64, 64)), NamedSharding(mesh, PartitionSpec("fsdp")))
    params = {"layers": {0: {"mlp": {"kernel": big}}}, "embed": split,
              "small": jax.device_put(jnp.zeros((4,)), NamedSharding(mesh, PartitionSpec()))}
    with pytest.raises(ValueError, match="layers/0/mlp/kernel"):
        check_sharded(params, mesh, min_size=1000, mode="raise", name="actor")
    with caplog.at_level(logging.WARNING):
        assert check_sharded(params, mesh, min_size=1000, mode="warn") == ["layers/0/mlp/kernel"]
    assert "layers/0/mlp/kernel" in caplog.text
    assert check_sharded({"embed": split}, mesh, min_size=1000, mode="raise") == []
    assert check_sharded(params, mesh, min_size=1000, mode="off") == []
