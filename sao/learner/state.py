"""Train states: optimiser construction and sharded creation.

A `TrainState` holds plain pytrees only (parameters as the nested dict of
``nnx.to_pure_dict``, the optax state, the update counter), so it goes through
``jax.jit`` with explicit shardings, buffer donation and orbax unchanged. The
model's structure (``nnx.GraphDef``) lives in a `ModelDef` next to it.
`LearnerStates` bundles the actor's and critic's train states, the reference
policy and the learner step counter.

Optimiser (`make_optimizer`), per actor and per critic:

* ``optax.multi_transform`` with two labels chosen by a path regex: ``frozen``
  parameters get ``optax.set_to_zero()`` (their values stay bit-identical, no
  optimiser moments are kept for them); ``train`` parameters get
  ``clip_by_global_norm`` (norm over the trainable parameters only) followed
  by AdamW with the LR schedule.
* Weight decay is masked off for parameters with fewer than two dimensions
  (norm scales, biases) and for embeddings (any path containing ``embed``).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sao.models.sharding import state_shardings

FROZEN, TRAIN = "frozen", "train"


@flax.struct.dataclass
class TrainState:
    """params: nested dict of arrays; opt_state: optax state; step: i32[]
    number of optimiser updates applied (skipped updates do not count)."""

    params: Any
    opt_state: Any
    step: jax.Array


@flax.struct.dataclass
class LearnerStates:
    """All learner arrays (one pytree: jitted, donated and checkpointed whole).

    Attributes:
      actor: policy `TrainState`; ``actor.step`` (updates applied) is the
        policy version of ``actor.params``.
      critic: critic `TrainState`, or None without a critic (GRPO).
      ref_params: frozen reference policy params for the KL term, or None.
      step: i32[] learner steps done (batches consumed, warm-up included).
    """

    actor: TrainState
    critic: TrainState | None
    ref_params: Any
    step: jax.Array

    @property
    def policy_version(self) -> int:
        return int(self.actor.step)


@dataclasses.dataclass(frozen=True)
class ModelDef:
    """Static half of a model: ``graphdef`` and the abstract ``nnx.State`` of
    its parameters (to rebuild a module from a params dict)."""

    graphdef: Any
    abstract_params: Any

    def param_state(self, params) -> nnx.State:
        """``params`` (nested dict) as the model's ``nnx.State`` of ``nnx.Param``
        (the layout ``sao.ckpt.publish`` writes and engines restore)."""
        state = jax.tree.map(lambda x: x, self.abstract_params)
        nnx.replace_by_pure_dict(state, params)
        return state

    def merge(self, params) -> nnx.Module:
        """A module view over ``params`` (nested dict) for use inside jit."""
        return nnx.merge(self.graphdef, self.param_state(params))


def path_str(path) -> str:
    """'/'-joined key path, e.g. ``layers/0/attn/q_proj/kernel``."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def freeze_labels(params, freeze_regex: str):
    """Pytree of ``"frozen"`` / ``"train"`` labels (``re.search`` on the path;
    an empty regex freezes nothing)."""
    pattern = re.compile(freeze_regex) if freeze_regex else None
    return jax.tree_util.tree_map_with_path(
        lambda p, _: FROZEN if pattern and pattern.search(path_str(p)) else TRAIN, params)


def decay_mask(params):
    """True where weight decay applies: >= 2-D and not an embedding."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x: len(x.shape) >= 2 and "embed" not in path_str(p), params)


def trainable_mask(params, freeze_regex: str):
    """True on parameters the optimiser updates."""
    return jax.tree.map(lambda label: label == TRAIN, freeze_labels(params, freeze_regex))


def make_schedule(peak_lr: float, kind: str, warmup_steps: int,
                  decay_steps: int) -> optax.Schedule:
    """Linear warm-up to ``peak_lr`` then ``constant`` / ``cosine`` / ``linear``
    decay to 0 over ``decay_steps`` updates. Raises ValueError on an unknown kind."""
    if kind == "constant":
        after = optax.constant_schedule(peak_lr)
    elif kind == "cosine":
        after = optax.cosine_decay_schedule(peak_lr, decay_steps)
    elif kind == "linear":
        after = optax.linear_schedule(peak_lr, 0.0, decay_steps)
    else:
        raise ValueError(f"unknown LR schedule {kind!r}; valid: constant, cosine, linear")
    if warmup_steps <= 0:
        return after
    warm = optax.linear_schedule(0.0, peak_lr, warmup_steps)
    return optax.join_schedules([warm, after], [warmup_steps])


def make_optimizer(params, *, lr: float, schedule: str = "constant", warmup_steps: int = 0,
                   decay_steps: int = 1000, max_grad_norm: float = 1.0,
                   weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.999,
                   eps: float = 1e-8, freeze_regex: str = "") -> optax.GradientTransformation:
    """AdamW with clipping, decay mask and path-regex freezing (module doc).

    Args:
      params: the parameter pytree (or its abstract shapes) to label.
      lr, schedule, warmup_steps, decay_steps: see `make_schedule`.
      max_grad_norm: global-norm clip over trainable params; 0 = off.
      weight_decay: AdamW decoupled decay; masked by `decay_mask`.
      freeze_regex: parameters whose path matches are frozen.
    """
    inner = []
    if max_grad_norm > 0:
        inner.append(optax.clip_by_global_norm(max_grad_norm))
    inner.append(optax.adamw(make_schedule(lr, schedule, warmup_steps, decay_steps),
                             b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                             mask=decay_mask))
    labels = freeze_labels(params, freeze_regex)
    return optax.multi_transform({TRAIN: optax.chain(*inner), FROZEN: optax.set_to_zero()},
                                 labels)


def _split_params(model: nnx.Module):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    if jax.tree.leaves(rest):
        raise ValueError("the learner trains models whose state is nnx.Param only; found "
                         f"other variables: {jax.tree.map(jnp.shape, rest)}")
    return graphdef, params


def state_sharding_tree(abstract_state: TrainState, param_shardings, tx,
                        mesh: Mesh) -> TrainState:
    """Shardings for a whole `TrainState`: optimiser moments follow their
    parameter (``optax.tree_map_params``), other leaves are replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    opt = optax.tree_utils.tree_map_params(
        tx, lambda p, s: p if isinstance(p, optax.MaskedNode) else s,
        abstract_state.opt_state, param_shardings,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, optax.MaskedNode))
    return TrainState(params=param_shardings, opt_state=opt, step=replicated)


@dataclasses.dataclass(frozen=True)
class StatePlan:
    """What `plan_state` decides before any parameter exists.

    ``init()`` materialises a fresh `TrainState` directly with ``shardings``
    (deterministic: the same factory or module gives the same bits each call).
    """

    model_def: ModelDef
    shardings: TrainState
    tx: optax.GradientTransformation
    init: Callable[[], TrainState]


def plan_state(model: nnx.Module | Callable[[], nnx.Module],
               make_tx: Callable[[Any], optax.GradientTransformation], mesh: Mesh) -> StatePlan:
    """Shapes, shardings and optimiser of a train state, plus its initialiser.

    Args:
      model: a factory ``() -> nnx.Module`` (parameters are then materialised
        directly with their sharding: ``jax.eval_shape`` for shapes, then
        ``jax.jit(init, out_shardings=...)``) or an existing module (its
        parameters are copied onto the mesh; the module is left untouched).
      make_tx: ``params -> optax transformation`` (e.g. a partial of
        `make_optimizer`).
      mesh: the learner mesh.
    Raises:
      ValueError: the model has variables other than ``nnx.Param``.
    """
    if isinstance(model, nnx.Module):
        graphdef, concrete = _split_params(model)
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), concrete)
        source = nnx.to_pure_dict(concrete)
    else:
        graphdef, abstract = _split_params(nnx.eval_shape(model))
        source = None
    model_def = ModelDef(graphdef=graphdef, abstract_params=abstract)
    param_shardings = nnx.to_pure_dict(state_shardings(abstract, mesh))
    abs_params = nnx.to_pure_dict(abstract)
    tx = make_tx(abs_params)

    def init(params):
        if params is None:
            params = nnx.to_pure_dict(_split_params(model())[1])
        params = jax.tree.map(jnp.copy, params)
        return TrainState(params=params, opt_state=tx.init(params),
                          step=jnp.zeros((), jnp.int32))

    abstract_state = jax.eval_shape(init, abs_params)
    shardings = state_sharding_tree(abstract_state, param_shardings, tx, mesh)
    # Not under jax.set_mesh: nnx.eval_shape inside a factory (e.g.
    # ValueModel.from_policy) would read logical axis names as mesh axes.
    jitted = jax.jit(init, out_shardings=shardings)
    return StatePlan(model_def=model_def, shardings=shardings, tx=tx,
                     init=lambda: jitted(source))

