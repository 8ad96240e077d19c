"""The same SAO update on a 2x2x2 mesh of 8 fake CPU devices and on one device."""
import jax
import numpy as np
import pytest

from sao.learner import LearnerConfig, make_train_batch
from sao.learner.learner import Learner
from sao.learner.mesh import mesh_from_config

from .helpers import make_policy, one_device_mesh, random_trajs

CFG = LearnerConfig(batch_size=8, length_buckets=(16,), critic_warmup_steps=0, critic_steps=1,
                    micro_batch_size=4, actor_lr=1e-3, critic_lr=1e-3, eps_low=0.5,
                    eps_high=1.0, shard_check="raise", shard_check_min_size=4096)


@pytest.mark.slow
def test_sharded_update_matches_single_device():
    rng = np.random.default_rng(0)
    batch = make_train_batch(random_trajs(7, rng, max_len=16), buckets=(16,), batch_size=8,
                             pad_id=256)
    out = {}
    for name, mesh in (("one", one_device_mesh()),
                       ("mesh", mesh_from_config({"data": 2, "fsdp": 2, "tensor": 2}))):
        learner = Learner(CFG, mesh, make_policy(0))
        states = learner.init_states()
        if name == "mesh":
            # created sharded: parameters and their Adam moments follow the rules table
            kernel = states.critic.params["layers"][0]["mlp"]["up_proj"]["kernel"]
            assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
            adam = states.critic.opt_state.inner_states["train"].inner_state[1][0]
            assert adam.mu["layers"][0]["mlp"]["up_proj"]["kernel"].sharding == kernel.sharding
            placed = learner.put_batch(batch)
            assert placed.tokens.sharding.spec[0] == ("data", "fsdp")
        states, metrics = learner.update(states, batch)
        out[name] = (metrics, jax.device_get(learner.actor_logprobs(states, batch.tokens)),
                     jax.device_get(learner.critic_values(states, batch.tokens)))
    (m1, lp1, v1), (m8, lp8, v8) = out["one"], out["mesh"]
    for key in ("actor/loss", "actor/grad_norm", "critic/value_loss", "critic/grad_norm",
                "actor/entropy", "critic/explained_variance"):
        np.testing.assert_allclose(m8[key], m1[key], rtol=1e-4, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(lp8, lp1, atol=1e-4)
    np.testing.assert_allclose(v8, v1, atol=1e-4)
