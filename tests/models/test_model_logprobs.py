"""token_logprobs / token_logprobs_and_entropy / predict_values: alignment,
chunking, float32 head, gradients."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sao.models import (Transformer, ValueModel, get_preset, predict_values, token_logprobs,
                        token_logprobs_and_entropy)


@pytest.fixture(scope="module")
def model():
    return Transformer(get_preset("tiny", num_layers=1), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.key(1), (3, 13), 0, 272)


@functools.partial(nnx.jit, static_argnames=("temperature", "chunk"))
def _lp_and_entropy(model, tokens, temperature, chunk):
    return token_logprobs_and_entropy(model, tokens, temperature=temperature, chunk=chunk)


@nnx.jit
def _logits(model, tokens):
    return model(tokens)


def _reference(model, tokens, temperature):
    logits = np.asarray(_logits(model, tokens), np.float64) / temperature
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    logp = logits - logz[..., None]
    lp = np.zeros(tokens.shape)
    ent = np.zeros(tokens.shape)
    for b in range(tokens.shape[0]):
        for t in range(1, tokens.shape[1]):
            lp[b, t] = logp[b, t - 1, tokens[b, t]]
            ent[b, t] = -(np.exp(logp[b, t - 1]) * logp[b, t - 1]).sum()
    return lp, ent


@pytest.mark.parametrize("chunk,temperature", [(4, 1.0), (5, 0.6), (128, 1.3)])
def test_matches_full_log_softmax(model, tokens, chunk, temperature):
    lp, ent = _lp_and_entropy(model, tokens, temperature, chunk)
    ref_lp, ref_ent = _reference(model, np.asarray(tokens), temperature)
    assert lp.dtype == jnp.float32 and lp.shape == tokens.shape
    np.testing.assert_allclose(lp, ref_lp, atol=2e-5)
    np.testing.assert_allclose(ent, ref_ent, atol=2e-5)
    assert np.all(np.asarray(lp[:, 0]) == 0) and np.all(np.asarray(ent[:, 0]) == 0)


def test_gradient_matches_unchunked(model, tokens):
    graphdef, state = nnx.split(model)

    def chunked(state):
        return token_logprobs(nnx.merge(graphdef, state), tokens, chunk=3).sum()

    def full(state):
        m = nnx.merge(graphdef, state)
        logp = jax.nn.log_softmax(m(tokens), -1)[:, :-1]
        return jnp.take_along_axis(logp, tokens[:, 1:, None], -1).sum()

    g1, g2 = jax.jit(jax.grad(chunked))(state), jax.jit(jax.grad(full))(state)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_bf16_params_give_f32_logprobs(tokens):
    m = Transformer(get_preset("tiny", num_layers=1, param_dtype="bfloat16", dtype="bfloat16"),
                    rngs=nnx.Rngs(0))
    lp = nnx.jit(token_logprobs)(m, tokens)
    assert lp.dtype == jnp.float32
    assert np.all(np.isfinite(lp)) and np.all(np.asarray(lp) <= 0)


def test_single_token_and_bad_input(model):
    one = jnp.array([[5], [7]], jnp.int32)
    np.testing.assert_array_equal(token_logprobs(model, one), np.zeros((2, 1)))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(model, one, temperature=0.0)
    with pytest.raises(ValueError, match="tokens"):
        token_logprobs(model, jnp.zeros((4,), jnp.int32))


def test_predict_values_alignment(model, tokens):
    critic = ValueModel.from_policy(model)
    np.testing.assert_array_equal(predict_values(critic, tokens), np.zeros(tokens.shape))
    w = jax.random.normal(jax.random.key(3), critic.value_head.kernel.shape)
    critic.value_head.kernel[...] = w
    critic.value_head.bias[...] = jnp.array([0.25])
    values = nnx.jit(predict_values)(critic, tokens)
    hidden = np.asarray(nnx.jit(lambda c, t: c.hidden_states(t))(critic, tokens), np.float64)
    expected = hidden @ np.asarray(w, np.float64)[:, 0] + 0.25
    assert values.dtype == jnp.float32 and values.shape == tokens.shape
    np.testing.assert_array_equal(values[:, 0], 0.0)
    np.testing.assert_allclose(values[:, 1:], expected[:, :-1], atol=1e-5)


def test_tiny_model_learns_a_fixed_batch(model):
    """One-step-at-a-time smoke test: the log-prob loss trains end to end."""
    import optax
    text = b"<answer>42</answer> " * 2
    tokens = jnp.asarray([list(text)] * 4, jnp.int32)
    graphdef, state = nnx.split(model)
    tx = optax.adam(1e-2)
    opt_state = tx.init(state)

    @jax.jit
    def step(state, opt_state):
        loss, grads = jax.value_and_grad(
            lambda st: -token_logprobs(nnx.merge(graphdef, st), tokens, chunk=16)[:, 1:].mean())(state)
        updates, opt_state = tx.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss

    losses = []
    for _ in range(20):
        state, opt_state, loss = step(state, opt_state)
        losses.append(float(loss))
    assert losses[0] > 5.0  # ~log(272) at init
    assert losses[-1] < 0.3 * losses[0], losses


def test_memory_options_same_values_and_gradients(model, tokens):
    """remat=True with attention_chunk=4 on T=13 (query blocks 4,4,4,1 after
    padding) gives the plain model's loss and gradients."""
    graphdef, state = nnx.split(model)
    chunked_gd = nnx.graphdef(Transformer(model.cfg.replace(attention_chunk=4, remat=True),
                                          rngs=nnx.Rngs(0)))

    def loss(gd, st):
        return token_logprobs(nnx.merge(gd, st), tokens, chunk=4).sum()

    l1, g1 = jax.jit(jax.value_and_grad(lambda st: loss(graphdef, st)))(state)
    l2, g2 = jax.jit(jax.value_and_grad(lambda st: loss(chunked_gd, st)))(state)
    np.testing.assert_allclose(l1, l2, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_entropy_and_temperature_gradients_match_autodiff(model, tokens):
    """The head's custom VJP against autodiff through full logits: a loss
    mixing log-probs and entropies with per-token weights, differentiated
    w.r.t. every parameter and a traced temperature."""
    graphdef, state = nnx.split(model)
    w_lp, w_ent = jax.random.normal(jax.random.key(5), (2,) + tokens.shape)

    def chunked(state, temp):
        lp, ent = token_logprobs_and_entropy(nnx.merge(graphdef, state), tokens,
                                             temperature=temp, chunk=5)
        return jnp.sum(w_lp * lp + w_ent * ent)

    def full(state, temp):
        logp = jax.nn.log_softmax(nnx.merge(graphdef, state)(tokens) / temp, -1)[:, :-1]
        lp = jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
        ent = -jnp.sum(jnp.exp(logp) * logp, -1)
        return jnp.sum(w_lp[:, 1:] * lp + w_ent[:, 1:] * ent)

    temp = jnp.float32(0.7)
    (l1, (g1, t1)), (l2, (g2, t2)) = (
        jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(state, temp) for f in (chunked, full))
    np.testing.assert_allclose(l1, l2, rtol=1e-5)
    np.testing.assert_allclose(t1, t2, rtol=1e-4)
    assert abs(float(t2)) > 1e-3  # the temperature gradient is not trivially zero
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(a, b, atol=2e-5)


def test_head_under_mixed_precision():
    """bf16 hidden states: the log-probs are those of the f32 head on the same
    (bf16-valued) hidden states, bit for bit; the backward products run in
    bf16 with f32 accumulation, so the gradients are within bf16 rounding of
    the f32 ones; the hidden gradient comes back in bf16, the kernel's in f32."""
    from sao.models.logprobs import _chunked_logprobs
    hidden = jax.random.normal(jax.random.key(0), (2, 6, 8)).astype(jnp.bfloat16)
    kernel = jax.random.normal(jax.random.key(1), (8, 11))
    targets = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 11

    def loss(h, k):
        lp, ent = _chunked_logprobs(h, targets, k, 0.8, 4)
        return lp.sum() + 0.3 * ent.sum(), lp

    (_, lp16), (gh, gk) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(hidden, kernel)
    (_, lp32), (gh32, gk32) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
        hidden.astype(jnp.float32), kernel)
    np.testing.assert_array_equal(lp16, lp32)
    assert gh.dtype == jnp.bfloat16 and gk.dtype == jnp.float32
    np.testing.assert_allclose(gk, gk32, rtol=2e-2, atol=2e-2 * float(jnp.max(jnp.abs(gk32))))
    np.testing.assert_allclose(gh.astype(jnp.float32), gh32, rtol=2e-2,
                               atol=2e-2 * float(jnp.max(jnp.abs(gh32))))
