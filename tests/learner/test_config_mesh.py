"""LearnerConfig validation and the mesh / multi-process decisions."""
import jax
import ml_collections
import numpy as np
import pytest

from sao.learner.config import LearnerConfig
from sao.learner.mesh import distributed_init_args, mesh_from_config


def test_from_config_defaults_and_overrides():
    cd = ml_collections.ConfigDict({"batch_size": 4, "length_buckets": [64, 32],
                                    "eps_low": 0.8, "eps_high": 3.0})
    cfg = LearnerConfig.from_config(cd)
    assert cfg.batch_size == 4 and cfg.length_buckets == (32, 64)
    assert cfg.policy_loss == "sao_dis" and cfg.critic_steps == 2
    assert cfg.critic_warmup_steps == 10 and cfg.alpha == 1.5 and cfg.gamma == 1.0
    assert cfg.uses_critic


@pytest.mark.parametrize("bad, match", [
    ({"eps_hihg": 1.0}, "unknown keys"),
    ({"batch_size": 6, "micro_batch_size": 4}, "must divide"),
    ({"truncation": "bootstrap"}, "truncation"),
    ({"gamma": 1.5}, "gamma"),
    ({"lam_policy": 2.0}, "lam_policy"),
    ({"critic_freeze_regex": "("}, "regex"),
    ({"actor_schedule": "step"}, "actor_schedule"),
])
def test_from_config_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        LearnerConfig.from_config(bad)


def test_distributed_decision():
    assert distributed_init_args({}) is None
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
           "JAX_PROCESS_ID": "2"}
    assert distributed_init_args(env) == {"coordinator_address": "10.0.0.1:1234",
                                          "num_processes": 4, "process_id": 2}
    assert distributed_init_args({**env, "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}) is None
    with pytest.raises(ValueError, match="missing"):
        distributed_init_args({"JAX_COORDINATOR_ADDRESS": "h:1"})
    with pytest.raises(ValueError, match="integers"):
        distributed_init_args({**env, "JAX_PROCESS_ID": "x"})
    with pytest.raises(ValueError, match="0 <="):
        distributed_init_args({**env, "JAX_PROCESS_ID": "4"})


def test_mesh_from_config():
    mesh = mesh_from_config(ml_collections.ConfigDict({"data": 2, "fsdp": 2, "tensor": 2}))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2, "expert": 1}
    assert dict(mesh_from_config({"data": -1, "tensor": 2}).shape)["data"] == len(jax.devices()) // 2
    with pytest.raises(ValueError, match="unknown keys"):
        mesh_from_config({"model": 2})
    with pytest.raises(ValueError, match="needs 6 devices"):
        mesh_from_config({"data": 3, "fsdp": 2})


def test_determinism_check_needs_gpu_flag():
    from types import SimpleNamespace

    from sao.learner.learner import GPU_DETERMINISM_FLAG, check_determinism

    gpu_mesh = SimpleNamespace(devices=np.array([SimpleNamespace(platform="gpu")]))
    with pytest.raises(ValueError, match="xla_gpu_deterministic_ops"):
        check_determinism(True, gpu_mesh, env={})
    check_determinism(True, gpu_mesh, env={"XLA_FLAGS": GPU_DETERMINISM_FLAG})
    check_determinism(False, gpu_mesh, env={})
    check_determinism(True, mesh_from_config({"data": -1}), env={})
