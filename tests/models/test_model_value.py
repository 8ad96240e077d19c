"""Value model: copy from the policy, zero head, path regexes for the
frozen-attention critic."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from sao.models import (ATTENTION_PARAMS_REGEX, MLP_PARAMS_REGEX, TRAINABLE_CRITIC_REGEX,
                        Transformer, ValueModel, get_preset, param_paths, path_filter,
                        predict_values)


def test_from_policy_copies_backbone_into_new_buffers():
    cfg = get_preset("tiny", num_layers=1, tie_word_embeddings=False)
    policy = Transformer(cfg, rngs=nnx.Rngs(0))
    critic = ValueModel.from_policy(policy)
    assert "lm_head/kernel" not in param_paths(critic)
    np.testing.assert_array_equal(critic.layers[0].mlp.up_proj.kernel[...],
                                  policy.layers[0].mlp.up_proj.kernel[...])
    assert np.all(np.asarray(critic.value_head.kernel[...]) == 0)
    # Training the critic must not touch the policy (no shared buffers).
    critic.layers[0].mlp.up_proj.kernel[...] = critic.layers[0].mlp.up_proj.kernel[...] + 1.0
    assert not np.allclose(critic.layers[0].mlp.up_proj.kernel[...],
                           policy.layers[0].mlp.up_proj.kernel[...])


def test_regexes_split_attention_and_mlp():
    for preset in ("tiny", "tiny-moe"):
        paths = param_paths(ValueModel(get_preset(preset, num_layers=2), rngs=nnx.Rngs(0)))
        attn = [p for p in paths if re.search(ATTENTION_PARAMS_REGEX, p)]
        mlp = [p for p in paths if re.search(MLP_PARAMS_REGEX, p)]
        assert attn and mlp and not set(attn) & set(mlp)
        assert all("/attn/" in p for p in attn)
        assert all("/mlp/" in p or "/moe/" in p for p in mlp)
        assert len(attn) == 2 * 6  # q,k,v,o + q_norm,k_norm per layer
        assert "layers/1/moe/router/kernel" in mlp or "layers/1/mlp/down_proj/kernel" in mlp


def test_frozen_attention_critic_step_moves_only_mlp_and_head():
    critic = ValueModel(get_preset("tiny", num_layers=1), rngs=nnx.Rngs(0))
    before = nnx.state(critic, nnx.Param)
    before = jax.tree.map(np.asarray, before)
    opt = nnx.Optimizer(critic, optax.sgd(0.1), wrt=path_filter(TRAINABLE_CRITIC_REGEX))
    tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, 272)

    def loss(model):
        return jnp.mean((predict_values(model, tokens) - 1.0) ** 2)

    @nnx.jit
    def step(model, opt):
        # Two steps: the first only moves the zero head, the second reaches the MLP.
        for _ in range(2):
            grads = nnx.grad(loss, argnums=nnx.DiffState(0, path_filter(TRAINABLE_CRITIC_REGEX)))(model)
            opt.update(model, grads)

    step(critic, opt)
    old = dict(nnx.to_flat_state(before))
    changed = {"/".join(map(str, k)) for k, v in nnx.to_flat_state(nnx.state(critic, nnx.Param))
               if not np.array_equal(v.get_value(), old[k].get_value())}
    assert "value_head/kernel" in changed and "layers/0/mlp/up_proj/kernel" in changed
    assert not any("/attn/" in p or p.startswith("embed") or "norm" in p for p in changed)
