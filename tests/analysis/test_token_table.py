"""sao.analysis.token_table: spans, DIS weights and the per-token table of hand-made
trajectories, each column checked against sao.algo calls and hand computation."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.helpers import SHARED_CFG, make_policy, one_device_mesh, shared_learner
from sao import algo
from sao.analysis import dis_weights, token_spans, token_tables, token_texts
from sao.learner import Learner, make_train_batch
from sao.models.tokenizer import ByteTokenizer
from sao.types import Trajectory

PROMPT, ACT1, OBS, ACT2 = [257, 1, 2], [10, 11, 12], [261, 5, 262], [13, 14]
# SHARED_CFG's band is (1 - 0.5, 1 + 1.0) = (0.5, 2.0): 0.4 is masked low, 2.5 high.
RATIOS = np.array([1.0, 0.4, 1.5, 2.5, 0.9])
LEARNER_VERSION = 3


def _trajectory(tokens, mask, rollout, versions, reward, tid, pid="p", finish="stop"):
    return Trajectory(tokens=np.asarray(tokens), action_mask=np.asarray(mask),
                      rollout_logprobs=rollout, policy_version=np.asarray(versions),
                      reward=reward, finish=finish, prompt_id=pid, trajectory_id=tid)


def _tool_trajectory(rollout=None):
    """prompt, 3 action tokens, a 3-token observation, 2 action tokens; reward 1."""
    tokens = PROMPT + ACT1 + OBS + ACT2
    mask = [False] * 3 + [True] * 3 + [False] * 3 + [True] * 2
    versions = [0] * 3 + [1] * 3 + [2] * 5
    rollout = np.where(mask, -5.0, 0.0) if rollout is None else rollout
    return _trajectory(tokens, mask, rollout, versions, 1.0, "tool")


def _short_trajectory():
    return _trajectory([257, 3, 20], [False, False, True], np.array([0.0, 0.0, -5.0]),
                       [1, 1, 1], 0.5, "short", pid="q")


def _hand_gae(rewards, values, mask, gamma, lam):
    """Classic GAE over the action tokens only (docs/algorithm.md §3), a Python loop."""
    adv, ret = np.zeros_like(values), np.zeros_like(values)
    next_a = next_v = 0.0
    for t in np.flatnonzero(mask)[::-1]:
        a = rewards[t] + gamma * next_v - values[t] + gamma * lam * next_a
        adv[t], ret[t] = a, a + values[t]
        next_a, next_v = a, values[t]
    return adv, ret


@pytest.fixture(scope="module")
def learner():
    return shared_learner()


@pytest.fixture(scope="module")
def states(learner):
    """Fresh states with a random value head (a fresh one is zero: all values 0) and
    the policy at version LEARNER_VERSION."""
    s = learner.init_states()
    rng = np.random.default_rng(0)

    def head(path, x):
        if "value_head" in jax.tree_util.keystr(path):
            return jnp.asarray(rng.normal(0.0, 0.5, x.shape), x.dtype)
        return x
    critic = s.critic.replace(params=jax.tree_util.tree_map_with_path(head, s.critic.params))
    actor = s.actor.replace(step=jnp.asarray(LEARNER_VERSION, jnp.int32))
    return s.replace(critic=critic, actor=actor)


def test_token_spans():
    mask = [False, False, True, True, False, False, True, False, True]
    assert token_spans(mask) == [("prompt", 0, 2), ("action", 2, 4), ("observation", 4, 6),
                                 ("action", 6, 7), ("observation", 7, 8), ("action", 8, 9)]
    assert token_spans([True, False]) == [("action", 0, 1), ("observation", 1, 2)]
    assert token_spans([False, False]) == [("prompt", 0, 2)]
    assert token_spans([]) == []
    with pytest.raises(ValueError, match=r"\[T\]"):
        token_spans(np.zeros((2, 2), bool))


def test_dis_weights_are_the_kernels_band():
    ratio = np.array([[1.0, 0.4, 0.69, 0.71, 5.9, 6.1, 3.0, 1.0]], np.float32)
    mask = np.array([[True] * 7 + [False]])
    lp = np.full_like(ratio, -2.0)
    w = dis_weights(lp, lp - np.log(ratio), mask, eps_low=0.3, eps_high=5.0)
    np.testing.assert_allclose(w, [[1.0, 0.0, 0.0, 0.71, 5.9, 0.0, 3.0, 0.0]], rtol=1e-5)
    with pytest.raises(ValueError):
        dis_weights(lp, lp, mask, eps_low=0.0, eps_high=5.0)


def test_columns_against_algo_and_hand(learner, states):
    cfg = learner.cfg
    # The learner's log-probs of the tokens, so that the rollout log-probs give RATIOS.
    short = _short_trajectory()
    probe = make_train_batch([_tool_trajectory(), short], buckets=cfg.length_buckets,
                             batch_size=cfg.batch_size, pad_id=cfg.pad_id)
    probe_lp = np.asarray(learner.actor_logprobs(states, probe.tokens))
    lp = probe_lp[0, :11]
    mask = _tool_trajectory().action_mask
    rollout = np.zeros(11, np.float32)
    rollout[mask] = lp[mask] - np.log(RATIOS)
    tool = _tool_trajectory(rollout)
    short.rollout_logprobs[2] = probe_lp[1, 2]                      # ratio 1
    tables = token_tables(learner, states, [tool, short])
    assert [len(t) for t in tables] == [11, 3]
    c = tables[0].columns
    assert tables[0].learner_version == LEARNER_VERSION
    assert (tables[0].eps_low, tables[0].eps_high) == (0.5, 1.0)

    np.testing.assert_array_equal(c["position"], np.arange(11))
    np.testing.assert_array_equal(c["tokens"], tool.tokens)
    assert list(c["span"]) == ["prompt"] * 3 + ["action"] * 3 + ["observation"] * 3 + ["action"] * 2
    np.testing.assert_array_equal(c["span_index"], [0] * 3 + [1] * 3 + [2] * 3 + [3] * 2)
    assert tables[0].num_observation_tokens == 3 and tables[1].num_observation_tokens == 0
    np.testing.assert_array_equal(c["action_mask"], mask)
    np.testing.assert_array_equal(c["policy_mask"], mask)
    np.testing.assert_array_equal(c["policy_version"], tool.policy_version)
    np.testing.assert_array_equal(c["staleness"], np.where(mask, LEARNER_VERSION - tool.policy_version, 0))
    np.testing.assert_array_equal(c["rewards"], [0.0] * 10 + [1.0])

    # values: the critic's own forward pass; advantages / returns: sao.algo and a hand loop.
    batch = make_train_batch([tool, short], buckets=cfg.length_buckets,
                             batch_size=cfg.batch_size, pad_id=cfg.pad_id)
    values = np.asarray(learner.critic_values(states, batch.tokens))
    np.testing.assert_allclose(c["values"], values[0, :11], rtol=1e-6)
    assert np.abs(c["values"][mask]).min() > 1e-4      # the random head gives real values
    lam = algo.length_adaptive_lambda(batch.action_mask, cfg.alpha)
    adv, _ = algo.gae(batch.rewards, values, batch.action_mask, gamma=cfg.gamma, lam=lam)
    _, ret = algo.gae(batch.rewards, values, batch.action_mask, gamma=cfg.gamma, lam=1.0)
    np.testing.assert_allclose(c["advantages"], np.asarray(adv)[0, :11], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c["returns"], np.asarray(ret)[0, :11], rtol=1e-5, atol=1e-6)
    hand_adv, _ = _hand_gae(c["rewards"], c["values"], mask, 1.0, 1 - 1 / (1.5 * 5))
    np.testing.assert_allclose(c["advantages"], hand_adv, rtol=1e-5, atol=1e-6)
    _, hand_ret = _hand_gae(c["rewards"], c["values"], mask, 1.0, 1.0)
    np.testing.assert_allclose(hand_ret[mask], 1.0, rtol=1e-5)    # γ = λ_critic = 1: the reward
    np.testing.assert_allclose(c["returns"], np.where(mask, 1.0, 0.0), rtol=1e-5, atol=1e-6)
    s = tables[1].columns                                           # one action token: λ = 1/3
    np.testing.assert_allclose(s["advantages"][2], 0.5 - s["values"][2], rtol=1e-5)

    # DIS: ratio against the rollout log-probs, the band's flags and weights.
    np.testing.assert_allclose(c["logprobs"], lp, rtol=1e-6)
    np.testing.assert_allclose(c["rollout_logprobs"], rollout)
    np.testing.assert_allclose(c["ratio"][mask], RATIOS, rtol=1e-4)
    assert np.isnan(c["ratio"][~mask]).all()
    np.testing.assert_array_equal(np.flatnonzero(c["dis_masked_low"]), [4])
    np.testing.assert_array_equal(np.flatnonzero(c["dis_masked_high"]), [9])
    np.testing.assert_allclose(c["dis_weight"][mask], [1.0, 0.0, 1.5, 0.0, 0.9], rtol=1e-4)
    assert not c["dis_weight"][~mask].any()
    assert tables[0].num_dis_masked == 2 and tables[1].num_dis_masked == 0
    assert tables[1].columns["ratio"][2] == pytest.approx(1.0, abs=1e-6)


def test_to_dataframe_and_texts(learner, states):
    table = token_tables(learner, states, [_tool_trajectory()])[0]
    tok = ByteTokenizer()
    df = table.to_dataframe(tok)
    assert len(df) == 11 and (df["trajectory_id"] == "tool").all()
    assert list(df["text"]) == token_texts(table.columns["tokens"], tok)
    assert df["text"][6] == "<output>" and df["text"][3] == "\n"
    assert set(table.columns) <= set(df.columns)
    np.testing.assert_array_equal(df["advantages"], table.columns["advantages"])


def test_errors(learner, states):
    with pytest.raises(ValueError, match="at least one"):
        token_tables(learner, states, [])
    with pytest.raises(ValueError, match="advantage_estimator='given'"):
        token_tables(learner, states, [_short_trajectory()], seq_advantages=[1.0])
    long = _trajectory([1] * 17, [False] + [True] * 16, np.zeros(17), [0] * 17, 1.0, "long")
    with pytest.raises(ValueError, match="length bucket"):
        token_tables(learner, states, [long])


def test_critic_free_estimators_and_chunks():
    """``given`` advantages over 5 trajectories (two batches of 4), then GRPO."""
    cfg = SHARED_CFG.replace(advantage_estimator="given", critic_steps=0, critic_warmup_steps=0)
    lrn = Learner(cfg, one_device_mesh(), make_policy(0))
    states = lrn.init_states()
    trajs = [_short_trajectory() for _ in range(4)] + [_tool_trajectory()]
    seq = np.array([0.5, -1.0, 2.0, 0.0, 3.0])
    tables = token_tables(lrn, states, trajs, seq_advantages=seq)
    for table, a in zip(tables, seq):
        m = table.columns["action_mask"]
        np.testing.assert_allclose(table.columns["advantages"][m], a)
        assert not table.columns["advantages"][~m].any()
        assert np.isnan(table.columns["values"]).all() and np.isnan(table.columns["returns"]).all()
    with pytest.raises(ValueError, match=r"f32\[5\]"):
        token_tables(lrn, states, trajs, seq_advantages=seq[:4])
    with pytest.raises(ValueError, match="exactly when"):
        token_tables(lrn, states, trajs)

    grpo = Learner(cfg.replace(advantage_estimator="grpo"), one_device_mesh(), make_policy(0))
    won, lost = _short_trajectory(), _short_trajectory()
    lost.reward = 0.0                                   # rewards 0.5 and 0: A = +1 and -1
    tables = token_tables(grpo, grpo.init_states(), [won, lost])
    assert [float(t.columns["advantages"][2]) for t in tables] == pytest.approx([1.0, -1.0], abs=1e-4)
    assert math.isnan(tables[0].columns["values"][2])
