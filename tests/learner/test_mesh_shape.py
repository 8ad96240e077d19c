"""Meshes from the machine: one axis may be -1; clear needed-vs-found errors;
command-line overrides of the multi-process variables."""
import jax
import pytest

from sao.learner.mesh import distributed_init_args, mesh_from_config, mesh_shape


@pytest.mark.parametrize("cd, n, want", [
    ({"fsdp": -1, "expert": 4}, 32, {"data": 1, "fsdp": 8, "tensor": 1, "expert": 4}),
    ({"fsdp": -1, "expert": 4}, 64, {"data": 1, "fsdp": 16, "tensor": 1, "expert": 4}),
    ({"data": -1, "fsdp": 4}, 32, {"data": 8, "fsdp": 4, "tensor": 1, "expert": 1}),
    ({"data": 1, "fsdp": 2, "tensor": -1}, 8, {"data": 1, "fsdp": 2, "tensor": 4, "expert": 1}),
    ({"data": 2, "fsdp": 2, "tensor": 2}, 8, {"data": 2, "fsdp": 2, "tensor": 2, "expert": 1}),
])
def test_mesh_shape_fills_one_axis(cd, n, want):
    assert mesh_shape(cd, n) == want


@pytest.mark.parametrize("cd, n, match", [
    ({"fsdp": 16, "expert": 4}, 32, r"needs 64 devices; found 32"),
    ({"fsdp": -1, "expert": 3}, 32, r"needs a multiple of 3 devices .*found 32"),
    ({"fsdp": -1, "data": -1}, 8, "at most one axis"),
    ({"fsdp": 0}, 8, "positive"),
    ({"fsdp": -2}, 8, "positive"),
    ({"pipeline": 2}, 8, "unknown keys"),
])
def test_mesh_shape_refuses_clearly(cd, n, match):
    with pytest.raises(ValueError, match=match):
        mesh_shape(cd, n)


def test_mesh_from_config_uses_every_device():
    mesh = mesh_from_config({"data": 2, "fsdp": -1})
    assert dict(mesh.shape) == {"data": 2, "fsdp": len(jax.devices()) // 2, "tensor": 1,
                                "expert": 1}
    assert mesh.devices.size == len(jax.devices())


def test_flags_override_environment():
    env = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "2"}
    got = distributed_init_args(env, process_id=3, coordinator_address="10.0.0.2:8476")
    assert got == {"coordinator_address": "10.0.0.2:8476", "num_processes": 4, "process_id": 3}
    got = distributed_init_args({}, coordinator_address="c:1", num_processes=2, process_id=0)
    assert got == {"coordinator_address": "c:1", "num_processes": 2, "process_id": 0}
    with pytest.raises(ValueError, match="missing"):
        distributed_init_args({}, num_processes=2)
    assert distributed_init_args({}, num_processes=0, process_id=-1) is None
