"""Value model (critic): the policy's backbone plus a zero-initialised scalar head.

Parameter paths equal the policy's (transformer.py) minus ``lm_head``, plus
``value_head/kernel [D, 1]`` (embed, None) and ``value_head/bias [1]``. The
regex constants below select parameter groups by path for the frozen-attention
critic (docs/algorithm.md §5): train `MLP_PARAMS_REGEX` + `VALUE_HEAD_REGEX`, freeze
the rest, e.g. ``nnx.Optimizer(critic, tx, wrt=path_filter(TRAINABLE_CRITIC_REGEX))``.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from sao.models.config import ModelConfig
from sao.models.layers import Dense
from sao.models.sharding import state_shardings
from sao.models.transformer import Decoder, Transformer

ATTENTION_PARAMS_REGEX = r"^layers/\d+/attn/"
MLP_PARAMS_REGEX = r"^layers/\d+/(mlp|moe)/"
VALUE_HEAD_REGEX = r"^value_head/"
TRAINABLE_CRITIC_REGEX = rf"{MLP_PARAMS_REGEX}|{VALUE_HEAD_REGEX}"


class ValueModel(Decoder):
    """``values_from_hidden(hidden_states(tokens))``; use `predict_values` for
    the aligned f32[B, T] values."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.value_head = Dense("...d,do->...o", (cfg.hidden_size, 1), ("embed", None),
                                bias_shape=(1,), bias_names=(None,), dtype=jnp.float32,
                                param_dtype=jnp.float32, rngs=rngs, zero_init=True)

    def values_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., D] -> f32[...] (head in float32)."""
        return self.value_head(hidden.astype(jnp.float32))[..., 0]

    @classmethod
    def from_policy(cls, policy: Transformer) -> "ValueModel":
        """A critic whose backbone is a copy (new buffers) of ``policy``'s; the
        value head is zero-initialised.

        The copies keep the policy's shardings; when the policy lives on a
        mesh (``from_pretrained(..., mesh=)``, ``create_sharded``), the head is
        created on that mesh with the sharding its rule names, so a critic of
        a sharded policy never gathers a parameter on one device.
        """
        critic = nnx.eval_shape(lambda: cls(policy.cfg, rngs=nnx.Rngs(0)))
        backbone = nnx.state(policy, nnx.Param)
        if "lm_head" in backbone:
            del backbone["lm_head"]
        nnx.update(critic, jax.tree.map(jnp.copy, backbone))
        head = nnx.state(critic.value_head, nnx.Param)
        mesh = _mesh_of(backbone)
        if mesh is None:
            zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), head)
        else:
            zeros = jax.tree.map(
                lambda a, s: jax.make_array_from_callback(
                    a.shape, s, lambda index, a=a: np.zeros(a.shape, a.dtype)[index]),
                head, state_shardings(head, mesh))
        nnx.update(critic.value_head, zeros)
        return critic


def _mesh_of(state: nnx.State):
    """The mesh of the first leaf placed with a ``NamedSharding``, else None."""
    for leaf in jax.tree.leaves(state):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding):
            return sharding.mesh
    return None


def _path_str(path) -> str:
    return "/".join(str(getattr(p, "key", p)) for p in path)


def param_paths(model: nnx.Module) -> list[str]:
    """'/'-joined paths of every ``nnx.Param`` of ``model`` (e.g.
    ``layers/0/attn/q_proj/kernel``), in tree order."""
    return [_path_str(path) for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))]


def path_filter(regex: str):
    """An nnx filter selecting ``nnx.Param`` whose '/'-joined path matches
    ``regex`` (``re.search``), for ``nnx.Optimizer(..., wrt=...)`` / ``nnx.state``."""
    pattern = re.compile(regex)

    def matches(path, value) -> bool:
        return pattern.search(_path_str(path)) is not None

    return nnx.All(nnx.Param, matches)
