"""The attention kernel's custom VJP and RoPE against plain references.

`sao.models.attention._attend` has a hand-written backward pass (the softmax
Jacobian from the saved probabilities); its gradients must equal autodiff of
the textbook formula, for causal, padded and decode-style masks and for GQA.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.models.attention import _attend
from sao.models.layers import rope


def _reference(q, k, v, mask):
    """Autodiff-able textbook attention, f32: softmax(q k^T / sqrt(hd)) v per head."""
    b, t, h, hd = q.shape
    rep = h // k.shape[2]
    kk, vv = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
    s = jnp.einsum("bthd,bshd->bhts", q, kk) / np.sqrt(hd)
    s = jnp.where(mask[:, None], s, -1e30)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, axis=-1), vv)


def _masks(b, t):
    causal = np.tril(np.ones((t, t), bool))[None].repeat(b, 0)
    padded = causal.copy()
    padded[1, :, :3] = False  # left padding of row 1 (its first 3 keys)
    padded[1, :3, 0] = True  # ...keeping one key per query row
    window = causal & ~np.tril(np.ones((t, t), bool), -4)[None]  # last 4 keys only
    # Rows that see no key: the output (mean of v) does not depend on q or k,
    # so neither may get a gradient from them.
    empty = causal.copy()
    empty[1, :3] = False
    return {"causal": causal, "padded": padded, "window": window, "fully_masked": empty}


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("mask_name", ["causal", "padded", "window", "fully_masked"])
def test_gradients_match_autodiff_of_the_reference(heads, kv_heads, mask_name):
    b, t, hd = 2, 12, 8
    ks = jax.random.split(jax.random.PRNGKey(heads * 10 + kv_heads), 4)
    q = jax.random.normal(ks[0], (b, t, heads, hd))
    k = jax.random.normal(ks[1], (b, t, kv_heads, hd))
    v = jax.random.normal(ks[2], (b, t, kv_heads, hd))
    w = jax.random.normal(ks[3], (b, t, heads, hd))
    mask = jnp.asarray(_masks(b, t)[mask_name])
    ours = lambda q, k, v: jnp.sum(_attend(q, k, v, mask) * w)
    ref = lambda q, k, v: jnp.sum(_reference(q, k, v, mask) * w)
    np.testing.assert_allclose(_attend(q, k, v, mask), _reference(q, k, v, mask),
                               atol=2e-6, rtol=2e-6)
    for g_ours, g_ref in zip(jax.grad(ours, (0, 1, 2))(q, k, v), jax.grad(ref, (0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(g_ours, g_ref, atol=5e-6, rtol=5e-6)


def test_bf16_operands_stay_close_to_f32_and_keep_dtypes():
    b, t, h, kv, hd = 2, 16, 4, 2, 16
    ks = jax.random.split(jax.random.PRNGKey(3), 4)
    q, w = jax.random.normal(ks[0], (b, t, h, hd)), jax.random.normal(ks[3], (b, t, h, hd))
    k, v = jax.random.normal(ks[1], (b, t, kv, hd)), jax.random.normal(ks[2], (b, t, kv, hd))
    mask = jnp.asarray(_masks(b, t)["causal"])
    loss = lambda q, k, v: jnp.sum(_attend(q, k, v, mask).astype(jnp.float32) * w)
    g32 = jax.grad(loss, (0, 1, 2))(q, k, v)
    g16 = jax.grad(loss, (0, 1, 2))(*(x.astype(jnp.bfloat16) for x in (q, k, v)))
    for a, b16 in zip(g32, g16):
        assert b16.dtype == jnp.bfloat16
        scale = float(jnp.max(jnp.abs(a)))
        assert float(jnp.max(jnp.abs(a - b16.astype(jnp.float32)))) < 0.02 * scale


def test_rope_matches_hf_rotate_half():
    """HF: ``x * cos(emb) + rotate_half(x) * sin(emb)``, ``emb = cat(freqs, freqs)``."""
    b, t, n, hd, theta = 2, 7, 3, 8, 10_000.0
    x = np.random.default_rng(0).normal(size=(b, t, n, hd)).astype(np.float32)
    pos = np.array([np.arange(t), np.arange(t) + 5], np.int32)
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    emb = np.concatenate([pos[..., None] * inv] * 2, -1)[:, :, None, :]
    rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    want = x * np.cos(emb) + rot * np.sin(emb)
    np.testing.assert_allclose(rope(jnp.asarray(x), jnp.asarray(pos), theta), want, atol=2e-5)
    assert rope(jnp.asarray(x, jnp.bfloat16), jnp.asarray(pos), theta).dtype == jnp.bfloat16
