"""Logical axis names, the one rules table that maps them to mesh axes, meshes.

Every parameter carries logical axis names in its ``out_sharding`` metadata
(see `transformer.py` for the tree); main activations are constrained with
`constrain(x, names)`. Names: ``vocab``, ``embed``, ``heads``, ``kv_heads``,
``head_dim``, ``mlp``, ``experts``, ``norm`` (parameters) and ``batch``, ``length`` plus
the same names (activations). Mesh axes: ``data``, ``fsdp``, ``tensor``,
``expert``.

`LOGICAL_AXIS_RULES` maps each logical name to a mesh axis, a tuple of mesh
axes, or None (replicated). Two safety rules make one table serve every model
and mesh: a mesh axis already used by an earlier dimension of the same array
is dropped (so ``batch`` on ``(data, fsdp)`` and ``embed`` on ``fsdp`` coexist
in activations), and a dimension whose size is not divisible by its mesh axes
is replicated (e.g. SmolLM2's 9 heads on tensor=2). Override the table with
``with axis_rules(my_rules): ...`` or by passing ``rules=``.

Creating a model already sharded: `create_sharded(make_model, mesh)` runs
``nnx.eval_shape`` for shapes, derives the shardings, then builds the
parameters inside ``jax.jit(..., out_shardings=...)`` so no host or single
device ever holds the full model.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor", "expert")

Rules = Sequence[tuple[str, Any]]

LOGICAL_AXIS_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp", "expert")),
    ("length", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("experts", "expert"),
    ("norm", None),
)

_RULES: contextvars.ContextVar[tuple] = contextvars.ContextVar("sao_axis_rules",
                                                               default=LOGICAL_AXIS_RULES)


@contextlib.contextmanager
def axis_rules(rules: Rules):
    """Context manager: use ``rules`` instead of `LOGICAL_AXIS_RULES`."""
    token = _RULES.set(tuple(rules))
    try:
        yield
    finally:
        _RULES.reset(token)


def current_rules() -> tuple:
    return _RULES.get()


def param_init(initializer: Callable, names: tuple[str | None, ...]) -> Callable:
    """Wraps an initializer so the created ``nnx.Param`` carries logical names.

    Sharding is applied by `create_sharded` / `shard_model`, not eagerly, so a
    model can be created without a mesh.
    """
    return nnx.with_partitioning(initializer, names, eager_sharding=False)


def logical_to_spec(names: Sequence[str | None] | None, shape: Sequence[int] | None = None,
                    mesh: Mesh | jax.sharding.AbstractMesh | None = None,
                    rules: Rules | None = None) -> PartitionSpec:
    """Maps logical axis names to a mesh `PartitionSpec`.

    Args:
      names: one logical name (or None) per array dimension.
      shape: array shape; with ``mesh``, dims not divisible by their mesh axes
        are replicated.
      mesh: restricts to axes present in the mesh with size > 1.
      rules: defaults to the current rules (`axis_rules` / `LOGICAL_AXIS_RULES`).
    Raises:
      ValueError: a name that is not in the rules table.
    """
    if names is None:
        return PartitionSpec()
    table = dict(current_rules() if rules is None else rules)
    sizes = dict(mesh.shape) if mesh is not None else None
    used: set[str] = set()
    out = []
    for i, name in enumerate(names):
        if name is None:
            out.append(None)
            continue
        if name not in table:
            raise ValueError(f"logical axis {name!r} has no rule; rules cover {sorted(table)}")
        target = table[name]
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used)
        if sizes is not None:
            axes = tuple(a for a in axes if sizes.get(a, 1) > 1)
            if shape is not None and axes:
                # Keep the longest prefix of axes whose product divides the dim.
                kept, prod = [], 1
                for a in axes:
                    if shape[i] % (prod * sizes[a]) == 0:
                        kept.append(a)
                        prod *= sizes[a]
                    else:
                        break
                axes = tuple(kept)
        used.update(axes)
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*out)


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
    """``with_sharding_constraint`` by logical names; no-op without a mesh.

    Active when tracing under ``jax.set_mesh(mesh)`` (as `create_sharded` and
    the learner's jitted steps do).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = logical_to_spec(names, x.shape, mesh)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, expert: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 4-axis ``Mesh(data, fsdp, tensor, expert)`` with Auto axis types.

    Raises:
      ValueError: the product of axis sizes differs from the device count.
    """
    shape = (data, fsdp, tensor, expert)
    devs = list(jax.devices() if devices is None else devices)
    if int(np.prod(shape)) != len(devs):
        raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))} needs {int(np.prod(shape))} "
                         f"devices, have {len(devs)}")
    return jax.make_mesh(shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 4,
                         devices=devs)


def _names(var: nnx.Variable):
    return var.get_metadata().get("out_sharding", None)


def state_shardings(state: nnx.State, mesh: Mesh, rules: Rules | None = None) -> nnx.State:
    """``NamedSharding`` per leaf of an (abstract or concrete) ``nnx.State``."""
    def one(var):
        value = var.get_value()
        spec = logical_to_spec(_names(var), getattr(value, "shape", None), mesh, rules)
        return var.replace(NamedSharding(mesh, spec))
    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def create_sharded(make_model: Callable[[], nnx.Module], mesh: Mesh,
                   rules: Rules | None = None) -> nnx.Module:
    """Builds ``make_model()`` with every parameter created already sharded.

    Shapes come from ``nnx.eval_shape``; the parameters are then materialised
    by ``jax.jit(..., out_shardings=...)`` under ``jax.set_mesh(mesh)``.
    """
    abstract = nnx.eval_shape(make_model)
    graphdef, abs_state = nnx.split(abstract)
    shardings = state_shardings(abs_state, mesh, rules)

    def init():
        return nnx.state(make_model())

    with jax.set_mesh(mesh):
        state = jax.jit(init, out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def shard_model(model: nnx.Module, mesh: Mesh, rules: Rules | None = None) -> nnx.Module:
    """Moves an existing model's parameters onto ``mesh`` per the rules (in place)."""
    state = nnx.state(model)
    shardings = state_shardings(state, mesh, rules)
    nnx.update(model, jax.device_put(state, shardings))
    return model


def unsharded_params(model: nnx.Module, mesh: Mesh, min_size: int = 2 ** 16) -> list[str]:
    """Paths of parameters with at least ``min_size`` elements that are fully
    replicated on ``mesh`` although the mesh has more than one device: a guard
    for "large parameters really are sharded". Empty list = all good."""
    bad = []
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = var.get_value()
        if value.size >= min_size and mesh.size > 1 and value.sharding.is_fully_replicated:
            bad.append("/".join(str(p) for p in path))
    return bad
