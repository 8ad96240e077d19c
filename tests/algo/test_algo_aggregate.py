"""Aggregation modes, masked statistics, explained variance and the registry."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.algo import (AGGREGATION_MODES, ADVANTAGE_ESTIMATORS, POLICY_LOSSES, aggregate,
                      explained_variance, get_advantage_estimator, get_policy_loss, masked_mean,
                      masked_var, masked_whiten)

X = np.array([[1.0, 2.0, np.nan, 4.0], [np.inf, 10.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]],
             np.float32)
M = np.array([[1, 1, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]], bool)


def aggregate_loop(x, m, mode, norm=None):
    rows = [[float(x[b, t]) for t in range(x.shape[1]) if m[b, t]] for b in range(x.shape[0])]
    rows = [r for r in rows if r]
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / len(rows)
    return sum(sum(r) for r in rows) / (len(rows) * (norm or x.shape[1]))


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_aggregate_modes_match_loop_and_never_leak_nan(mode):
    # token-mean: (1+2+4+10)/4; seq-mean-token-mean: (7/3 + 10)/2;
    # seq-mean-token-sum: 17/2; seq-mean-token-sum-norm: 17/(2*4).
    out = aggregate(X, M, mode)
    np.testing.assert_allclose(out, aggregate_loop(X, M, mode), rtol=1e-6)
    grad = jax.grad(lambda x: aggregate(x, M, mode))(jnp.asarray(X))
    assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[~M] == 0)


def test_token_mean_over_micro_batches_equals_whole_batch():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 12)).astype(np.float32)
    m = rng.random((8, 12)) < np.linspace(0.1, 0.9, 8)[:, None]  # uneven token counts
    whole = aggregate(x, m, "token-mean")
    total = m.sum()
    parts = sum(aggregate(x[i:i + 2], m[i:i + 2], "token-mean", global_token_count=total)
                for i in range(0, 8, 2))
    np.testing.assert_allclose(parts, whole, rtol=1e-6)
    mean_of_means = np.mean([aggregate(x[i:i + 2], m[i:i + 2], "token-mean")
                             for i in range(0, 8, 2)])
    assert abs(mean_of_means - whole) > 1e-3  # the naive mean of means differs
    n_seq = (m.sum(1) > 0).sum()
    seq = sum(aggregate(x[i:i + 2], m[i:i + 2], "seq-mean-token-mean", global_seq_count=n_seq)
              for i in range(0, 8, 2))
    np.testing.assert_allclose(seq, aggregate(x, m, "seq-mean-token-mean"), rtol=1e-6)


def test_aggregate_empty_mask_normaliser_and_errors():
    assert aggregate(X, np.zeros_like(M), "token-mean") == 0.0
    np.testing.assert_allclose(aggregate(X, M, "seq-mean-token-sum-norm", normalizer=100.0),
                               17 / 200, rtol=1e-6)
    assert aggregate(jnp.asarray(X, jnp.bfloat16), M).dtype == jnp.float32
    with pytest.raises(ValueError, match="valid"):
        aggregate(X, M, "sum")
    with pytest.raises(ValueError, match="shape"):
        aggregate(X, M[:, :2])
    # Concrete hyper-parameters out of range raise instead of giving -inf / a
    # silently clamped denominator.
    for bad in (0.0, -3.0, np.float32(0.0), np.nan):
        with pytest.raises(ValueError, match="normalizer"):
            aggregate(X, M, "seq-mean-token-sum-norm", normalizer=bad)
    with pytest.raises(ValueError, match="global_token_count"):
        aggregate(X, M, global_token_count=-1)
    with pytest.raises(ValueError, match="global_seq_count"):
        aggregate(X, M, "seq-mean-token-mean", global_seq_count=jnp.asarray(-2.0))
    assert aggregate(X, np.zeros_like(M), global_token_count=0) == 0.0  # empty global batch
    # Traced values cannot be inspected and pass through.
    assert np.isfinite(jax.jit(lambda n: aggregate(X, M, "seq-mean-token-sum-norm",
                                                   normalizer=n))(4.0))


def test_masked_statistics():
    np.testing.assert_allclose(masked_mean(X, M), 17 / 4)
    np.testing.assert_allclose(masked_mean(X, M, axis=1), [7 / 3, 10.0, 0.0])
    sel = X[M]
    np.testing.assert_allclose(masked_var(X, M), sel.var(), rtol=1e-6)
    np.testing.assert_allclose(masked_var(X, M, unbiased=True), sel.var(ddof=1), rtol=1e-6)
    white = masked_whiten(X, M)
    np.testing.assert_allclose(np.asarray(white)[M], (sel - sel.mean()) / np.sqrt(sel.var() + 1e-8),
                               rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(white)[~M], 0.0)
    unshifted = masked_whiten(X, M, shift_mean=False)
    np.testing.assert_allclose(masked_mean(unshifted, M), sel.mean(), rtol=1e-5)


def test_explained_variance():
    rng = np.random.default_rng(1)
    returns = rng.normal(size=(3, 10)).astype(np.float32)
    values = returns + 0.3 * rng.normal(size=(3, 10)).astype(np.float32)
    mask = rng.random((3, 10)) < 0.7
    values_nan = np.where(mask, values, np.nan)
    ev = explained_variance(values_nan, returns, mask)
    r, v = returns[mask], values[mask]
    np.testing.assert_allclose(ev, 1 - np.var(r - v) / np.var(r), rtol=1e-5)
    np.testing.assert_allclose(explained_variance(returns, returns, mask), 1.0)
    np.testing.assert_allclose(explained_variance(np.zeros_like(returns), np.ones_like(returns),
                                                  mask), 0.0)  # constant returns: defined as 0


def test_registry():
    for name in ("sao_dis", "ppo_clip", "gspo", "grpo_tis", "grpo_mis"):
        assert callable(get_policy_loss(name))
    for name in ("gae", "grpo", "dr_grpo", "rloo", "running_mean", "reinforce_pp"):
        assert get_advantage_estimator(name) is ADVANTAGE_ESTIMATORS[name]
    with pytest.raises(ValueError, match="sao_dis"):
        get_policy_loss("sao-dis")
    with pytest.raises(ValueError, match="reinforce_pp"):
        get_advantage_estimator("vtrace")
    # Uniform signature: every policy loss takes the same four arrays.
    rng = np.random.default_rng(2)
    lp = -rng.random((2, 5)).astype(np.float32)
    mask = np.ones((2, 5), bool)
    for name, fn in POLICY_LOSSES.items():
        kw = {"rollout_logprobs": lp} if name.startswith("grpo_") else {}
        if name == "sao_dis":
            kw = {"eps_low": 0.3, "eps_high": 5.0}
        loss, diag = jax.jit(fn)(lp, lp, np.ones_like(lp), mask, **kw)  # jit-compatible
        assert loss.shape == (2, 5) and "mean_ratio" in diag, name
        # Ratio 1 and A = 1: DIS gives -logprob, the PPO-style losses -ratio = -1.
        np.testing.assert_allclose(loss, -lp if name == "sao_dis" else -1.0, rtol=1e-6)
