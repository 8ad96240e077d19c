"""experiments/repro/holdout.py: out-of-sweep seeds against the sweep's reported spread."""
import math

import numpy as np
import pytest

from experiments.repro import base, holdout, results


def test_holdout_seeds_are_outside_the_sweep():
    assert not set(holdout.HOLDOUT_SEEDS) & (set(base.SEEDS) | set(base.SECONDARY_SEEDS))


def test_prediction_interval_matches_the_formula():
    # mean 1.5, sd sqrt(5/3), t(0.975, 3) = 3.18245: half = t * sd * sqrt(1 + 1/4)
    lo, hi = holdout.prediction_interval([0, 1, 2, 3])
    half = 3.182446305284263 * math.sqrt(5 / 3) * math.sqrt(1.25)
    assert (lo, hi) == pytest.approx((1.5 - half, 1.5 + half), rel=1e-9)
    assert holdout.prediction_interval([1.0]) is None
    with pytest.raises(ValueError):
        holdout.prediction_interval([1, 2], level=1.0)
    # about 95% of new draws fall inside, over many small samples (coverage, not just shape)
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(4000):
        draws = rng.normal(size=9)
        lo, hi = holdout.prediction_interval(draws[:8])
        hits += lo <= draws[8] <= hi
    assert 0.93 < hits / 4000 < 0.97


def _run(arm, seed, auc_level):
    """A finished run whose held-out curve is flat at ``auc_level`` over the arm's updates."""
    updates = results.actor_updates(arm)
    rl = [{"step": 0, "eval/accuracy": auc_level},
          {"step": updates, "learner/policy_version": updates, "eval/accuracy": auc_level}]
    return results.Run(arm, seed, "done", {}, rl)


def test_rows_place_each_held_out_run_and_its_pair():
    sweep_runs = {"m_sao": [_run("m_sao", s, 0.5 + 0.01 * s) for s in range(8)],
                  "m_grpo": [_run("m_grpo", s, 0.6 + 0.01 * s) for s in range(8)]}
    held = {"m_sao": [_run("m_sao", 100, 0.53)], "m_grpo": [_run("m_grpo", 100, 0.95)]}
    table = holdout.rows(sweep_runs, held)
    by = {(t["what"], t["endpoint"]): t for t in table}
    sao = by[("m_sao", "AUC")]
    assert sao["value"] == pytest.approx(0.53) and sao["in_range"] and sao["in_interval"]
    assert sao["n"] == 8 and sao["range"] == pytest.approx((0.5, 0.57))
    grpo = by[("m_grpo", "AUC")]
    assert not grpo["in_range"] and not grpo["in_interval"]           # 0.95: far above 0.60..0.67
    pair = by[("m_grpo − m_sao", "AUC")]                               # 0.95 - 0.53 vs 0.10 each
    assert pair["value"] == pytest.approx(0.42) and not pair["in_interval"]
    # arms without sweep runs (or with one) are not placed; unfinished held-out runs neither
    held["m_vapo"] = [_run("m_vapo", 100, 0.5)]
    held["m_grpo_dis"] = [results.Run("m_grpo_dis", 100, "partial", {}, [])]
    assert len(holdout.rows(sweep_runs, held)) == len(table)


def test_markdown_without_runs_says_how_to_make_them(tmp_path):
    text = holdout.markdown(str(tmp_path), {})
    assert "No finished run of the held-out seeds" in text and "--seeds 100,101" in text
