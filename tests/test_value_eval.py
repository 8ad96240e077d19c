"""Critics scored on one fixed held-out episode set (sao.value_eval)."""
import os
import sys

import numpy as np
import pytest

from sao import value_eval
from sao.learner import make_train_batch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learner.helpers import SHARED_CFG, random_trajs, shared_learner  # noqa: E402


def _returns_loop(rewards, mask, gamma):
    out = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        idx = [t for t in range(rewards.shape[1]) if mask[b, t]]
        for j, t in enumerate(idx):
            out[b, t] = rewards[b].sum() * gamma ** (len(idx) - 1 - j)
    return out


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_mc_returns_match_loop(gamma):
    rng = np.random.default_rng(0)
    mask = rng.random((4, 12)) < 0.6
    rewards = np.zeros((4, 12))
    for b in range(4):
        if mask[b].any():
            rewards[b, np.flatnonzero(mask[b])[-1]] = rng.normal()
    np.testing.assert_allclose(value_eval.mc_returns(rewards, mask, gamma),
                               _returns_loop(rewards, mask, gamma))


def test_value_errors():
    g = np.array([[0.0, 1.0, 1.0, 9.0]])
    mask = np.array([[True, True, True, False]])
    out = value_eval.value_errors(g, g, mask)
    assert out == {"eval/value_mse": 0.0, "eval/explained_variance": 1.0}
    out = value_eval.value_errors(np.full_like(g, 2 / 3), g, mask)
    assert out["eval/explained_variance"] == pytest.approx(0.0)
    assert out["eval/value_mse"] == pytest.approx(np.var([0, 1, 1]))
    assert value_eval.value_errors(g, g, ~np.ones_like(mask)) == {}


def test_fixed_set_scores_the_critic_and_tracks_its_fit(tmp_path):
    learner = shared_learner()
    trajs = random_trajs(8, np.random.default_rng(1), min_len=8, max_len=16)
    path = str(tmp_path / "set.bin")
    value_eval.save_episodes(path, trajs)
    loaded = value_eval.load_episodes(path)
    assert [t.reward for t in loaded] == [t.reward for t in trajs]
    np.testing.assert_array_equal(loaded[3].tokens, trajs[3].tokens)
    kw = dict(buckets=SHARED_CFG.length_buckets, batch_size=SHARED_CFG.batch_size,
              pad_id=SHARED_CFG.pad_id, gamma=SHARED_CFG.gamma)
    states = learner.init_states()

    def score(s):
        return value_eval.heldout_value_metrics(lambda tok: learner.critic_values(s, tok),
                                                loaded, **kw)
    before = score(states)
    # by hand on the first rows: the same numbers
    b = make_train_batch(loaded[:4], buckets=SHARED_CFG.length_buckets, batch_size=4,
                         pad_id=SHARED_CFG.pad_id)
    assert set(before) == {"eval/value_mse", "eval/explained_variance"}
    batches = [make_train_batch(loaded[i:i + 4], buckets=SHARED_CFG.length_buckets,
                                batch_size=4, pad_id=SHARED_CFG.pad_id) for i in (0, 4)]
    states, _ = learner.value_pretrain(states, batches, max_steps=30, ev_threshold=2.0)
    after = score(states)
    assert after["eval/value_mse"] < before["eval/value_mse"]          # fitted on this very set
    assert after["eval/explained_variance"] > before["eval/explained_variance"]
    assert b.tokens.shape[0] == 4
    with open(path, "ab") as f:
        f.write(b"\x05\x00")
    with pytest.raises(ValueError, match="truncated"):
        value_eval.load_episodes(path)
