"""Band counts per lag (sao.algo.lag_masks) against the NumPy loop reference."""
import jax
import numpy as np
import pytest

from sao.algo import dis_policy_loss
from sao.algo.lag_masks import band_counts_by_lag, rates_by_lag
from algo_reference import band_counts_by_lag_loop


def _case(seed, shape=(5, 23)):
    rng = np.random.default_rng(seed)
    log_ratio = rng.normal(0.0, 0.8, shape).astype(np.float32)
    lags = rng.integers(-1, 7, shape)
    mask = rng.random(shape) < 0.7
    log_ratio[~mask] = np.nan              # padding garbage must not leak in
    return log_ratio, lags, mask


@pytest.mark.parametrize("seed,bins,eps", [(0, 4, (0.3, 5.0)), (1, 1, (0.2, 0.28)),
                                           (2, 9, (0.8, 3.0))])
def test_matches_loop_reference(seed, bins, eps):
    log_ratio, lags, mask = _case(seed)
    got = jax.jit(band_counts_by_lag, static_argnames=("eps_low", "eps_high", "num_bins"))(
        log_ratio, lags, mask, eps_low=eps[0], eps_high=eps[1], num_bins=bins)
    want = band_counts_by_lag_loop(log_ratio, lags, mask, eps[0], eps[1], bins)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), want[k])
    assert float(np.sum(got["tokens"])) == mask.sum()


def test_pooled_rates_equal_dis_mask_fractions():
    log_ratio, lags, mask = _case(3)
    log_ratio = np.where(mask, log_ratio, 0.0)
    zeros = np.zeros_like(log_ratio)
    _, diag = dis_policy_loss(log_ratio, zeros, zeros, mask, eps_low=0.3, eps_high=0.5)
    c = band_counts_by_lag(log_ratio, lags, mask, eps_low=0.3, eps_high=0.5, num_bins=4)
    n = float(np.sum(c["tokens"]))
    np.testing.assert_allclose(float(np.sum(c["low"])) / n, float(diag["frac_masked_low"]),
                               rtol=1e-6)
    np.testing.assert_allclose(float(np.sum(c["high"])) / n, float(diag["frac_masked_high"]),
                               rtol=1e-6)


def test_rates_by_lag_names_and_skips_empty_bins():
    counts = {"tokens": np.array([10.0, 0.0, 4.0]), "low": np.array([1.0, 0.0, 2.0]),
              "high": np.array([0.0, 0.0, 1.0])}
    out = rates_by_lag(counts, "actor/")
    assert out == {"actor/tokens/lag0": 10.0, "actor/masked_low/lag0": 0.1,
                   "actor/masked_high/lag0": 0.0, "actor/tokens/lag2+": 4.0,
                   "actor/masked_low/lag2+": 0.5, "actor/masked_high/lag2+": 0.25}


def test_bad_arguments_raise():
    log_ratio, lags, mask = _case(4)
    with pytest.raises(ValueError, match="shape"):
        band_counts_by_lag(log_ratio[:, 1:], lags, mask, eps_low=0.3, eps_high=5.0, num_bins=3)
    with pytest.raises(ValueError, match="num_bins"):
        band_counts_by_lag(log_ratio, lags, mask, eps_low=0.3, eps_high=5.0, num_bins=0)
    with pytest.raises(ValueError):
        band_counts_by_lag(log_ratio, lags, mask, eps_low=1.5, eps_high=5.0, num_bins=3)
