"""The SAO update on one device: direction of the actor and critic updates,
critic warm-up, frozen critic attention, non-finite skip, recompile guard,
micro-batch equivalence, value pretraining and the GRPO baseline."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.learner import make_train_batch, steps
from sao.learner.learner import Learner, LearnerStates
from sao.learner.update import gae_targets

from .helpers import (SHARED_CFG, make_policy, one_device_mesh, random_trajs, shared_learner,
                      traj)

CFG = SHARED_CFG
GOOD, BAD, OTHER = 10, 20, 30


@pytest.fixture(scope="module")
def learner():
    return shared_learner()


def _host(tree):
    return jax.tree.map(lambda x: np.array(x), jax.device_get(tree))


def _hand_batch(learner, states):
    """P1: GOOD -> +1, BAD -> -1; P2: OTHER -> +2 (twice). Rollout log-probs
    equal the current policy's so every ratio is 1."""
    p1, p2 = [257, 1, 2], [257, 3, 4]
    trajs = [traj(p1, [GOOD], 1.0, pid="p1"), traj(p1, [BAD], -1.0, pid="p1"),
             traj(p2, [OTHER], 2.0, pid="p2"), traj(p2, [OTHER], 2.0, pid="p2")]
    batch = make_train_batch(trajs, buckets=CFG.length_buckets, batch_size=4, pad_id=256)
    lp = np.asarray(learner.actor_logprobs(states, batch.tokens))
    return batch.replace(rollout_logprobs=np.where(batch.action_mask, lp, 0.0).astype(np.float32))


def test_update_moves_policy_and_critic(learner):
    states = learner.init_states()
    batch = _hand_batch(learner, states)
    lp0 = np.asarray(learner.actor_logprobs(states, batch.tokens))[:, 3]
    v0 = np.asarray(learner.critic_values(states, batch.tokens))[:, 3]
    actor0, critic0 = _host(states.actor.params), _host(states.critic.params)

    # Step 1 is critic warm-up: the actor must not move.
    states, m1 = learner.update(states, batch)
    assert m1["learner/actor_updated"] == 0 and m1["learner/policy_version"] == 0
    assert not any(k.startswith("actor/") for k in m1)
    for a, b in zip(jax.tree.leaves(_host(states.actor.params)), jax.tree.leaves(actor0)):
        np.testing.assert_array_equal(a, b)

    states, m2 = learner.update(states, batch)
    assert m2["learner/actor_updated"] == 1 and m2["learner/policy_version"] == 1
    assert m2["actor/frac_masked_low"] == 0 and m2["actor/frac_masked_high"] == 0
    assert m2["batch/staleness_max"] == 0 and m2["actor/skipped_nonfinite_loss"] == 0
    np.testing.assert_allclose(m2["actor/mean_ratio"], 1.0, atol=1e-5)
    lp1 = np.asarray(learner.actor_logprobs(states, batch.tokens))[:, 3]
    v1 = np.asarray(learner.critic_values(states, batch.tokens))[:, 3]
    assert lp1[0] > lp0[0] + 1e-3, "positive-advantage action became more likely"
    assert lp1[1] < lp0[1] - 1e-3, "negative-advantage action became less likely"
    assert abs(v1[2] - 2.0) < abs(v0[2] - 2.0) - 0.05, "critic moved toward the return"
    assert m2["critic/value_loss"] < m1["critic/value_loss"]

    # Frozen attention of the critic is bit-identical; its MLP trained.
    critic1 = _host(states.critic.params)
    np.testing.assert_array_equal(critic1["layers"][0]["attn"]["q_proj"]["kernel"],
                                  critic0["layers"][0]["attn"]["q_proj"]["kernel"])
    assert not np.array_equal(critic1["layers"][0]["mlp"]["up_proj"]["kernel"],
                              critic0["layers"][0]["mlp"]["up_proj"]["kernel"])
    assert int(states.step) == 2


def test_nonfinite_batch_skips_both_updates(learner):
    states = learner.init_states()
    batch = _hand_batch(learner, states)
    rewards = batch.rewards.copy()
    rewards[0, 3] = np.nan
    batch = batch.replace(rewards=rewards)
    before = _host(states)
    states, _ = learner.update(states, batch)  # warm-up step
    states, m = learner.update(states, batch)
    assert m["critic/skipped_nonfinite_loss"] == 1 and m["actor/skipped_nonfinite_loss"] == 1
    assert m["learner/policy_version"] == 0
    after = _host(states)
    for a, b in zip(jax.tree.leaves(after.actor), jax.tree.leaves(before.actor)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree.leaves(after.critic), jax.tree.leaves(before.critic)):
        np.testing.assert_array_equal(a, b)


def test_bounded_recompiles(learner):
    # The learner is shared with other modules (tests/analysis calls critic_values
    # directly): count the variants this test's batches add, one per bucket at most.
    before = learner.compiled_sizes()
    rng = np.random.default_rng(1)
    states = learner.init_states()
    for n, hi in [(3, 8), (4, 16), (2, 12), (4, 6), (1, 16)]:
        batch = make_train_batch(random_trajs(n, rng, min_len=5, max_len=hi),
                                 buckets=CFG.length_buckets, batch_size=4, pad_id=256)
        states, m = learner.update(states, batch)
        assert np.isfinite(m["critic/value_loss"])
    after = learner.compiled_sizes()
    added = {k: after[k] - before[k] for k in after}
    assert all(n <= len(CFG.length_buckets) for n in added.values()), (before, after)


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_equal_whole_batch(learner, agg_mode):
    rng = np.random.default_rng(2)
    batch = learner.put_batch(make_train_batch(random_trajs(4, rng, max_len=16),
                                               buckets=CFG.length_buckets, batch_size=4,
                                               pad_id=256))
    states = learner.init_states()
    adv = jnp.where(batch.action_mask, jnp.linspace(-1.0, 1.0, 16)[None, :], 0.0)
    actor_in = dict(tokens=batch.tokens, policy_mask=batch.action_mask, advantages=adv,
                    rollout_logprobs=batch.rollout_logprobs)
    critic_in = dict(tokens=batch.tokens, action_mask=batch.action_mask, returns=adv + 0.5,
                     old_values=jnp.zeros_like(adv))
    out = {}
    for n in (1, 2):
        a = jax.jit(functools.partial(
            steps.actor_grads, model_def=learner.actor_def, num_micro=n, policy_loss="sao_dis",
            hparams=dict(eps_low=0.5, eps_high=1.0), agg_mode=agg_mode, temperature=1.0,
            kl_coef=0.0, kl_estimator="k3", entropy_coef=0.01))(states.actor.params, None, actor_in)
        c = ()
        if agg_mode == "token-mean":  # the critic always aggregates by token mean
            c = jax.jit(functools.partial(steps.critic_grads, model_def=learner.critic_def,
                                          num_micro=n, value_clip=0.2))(states.critic.params,
                                                                        critic_in)
            c = (c[0][0], c[1])
        out[n] = _host((a[0][0], a[1]) + c)
    for x, y in zip(jax.tree.leaves(out[2]), jax.tree.leaves(out[1])):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
    assert float(out[1][0]) != 0.0


def test_truncation_drop_removes_rows_from_policy_loss(learner):
    trajs = [traj([257, 1], [10, 11], 1.0, finish="length"), traj([257, 2], [12], 1.0)]
    batch = jax.device_put(make_train_batch(trajs, buckets=(8,), batch_size=2, pad_id=256))
    values = jnp.zeros(batch.tokens.shape)
    kw = dict(gamma=1.0, alpha=1.5, lam_policy=None, lam_critic=1.0, whiten=False)
    keep = gae_targets(batch, values, jnp.int32(0), drop_truncated=False, **kw)
    drop = gae_targets(batch, values, jnp.int32(0), drop_truncated=True, **kw)
    assert bool(keep["policy_mask"][0].any()) and not bool(drop["policy_mask"][0].any())
    np.testing.assert_array_equal(drop["action_mask"], keep["action_mask"])
    # terminal with the env reward: MC return 1 on both action tokens of the truncated row
    np.testing.assert_allclose(np.asarray(keep["returns"][0, 2:4]), [1.0, 1.0])


def test_value_pretrain_raises_explained_variance(learner):
    states = learner.init_states()
    rng = np.random.default_rng(3)
    batch = make_train_batch(random_trajs(4, rng, max_len=16), buckets=CFG.length_buckets,
                             batch_size=4, pad_id=256)
    actor0 = _host(states.actor.params)
    states, out = learner.value_pretrain(states, [batch], ev_threshold=0.9, max_steps=25)
    assert out["history"][-1] > out["history"][0]
    assert out["steps"] == 25 or out["explained_variance"] >= 0.9
    assert int(states.step) == 0
    for a, b in zip(jax.tree.leaves(_host(states.actor.params)), jax.tree.leaves(actor0)):
        np.testing.assert_array_equal(a, b)
    states, out = learner.value_pretrain(states, [batch], ev_threshold=-np.inf)
    assert out["steps"] == 0


def test_grpo_baseline_with_kl():
    cfg = CFG.replace(advantage_estimator="grpo", policy_loss="ppo_clip", eps_low=0.2,
                      eps_high=0.28, kl_coef=0.1, critic_steps=0, critic_warmup_steps=0)
    lrn = Learner(cfg, one_device_mesh(), make_policy(0))
    states = lrn.init_states()
    assert states.critic is None and states.ref_params is not None
    p = [257, 1, 2]
    trajs = [traj(p, [GOOD], 1.0, pid="g"), traj(p, [BAD], 0.0, pid="g"),
             traj(p, [GOOD], 1.0, pid="g"), traj(p, [BAD], 0.0, pid="g")]
    batch = make_train_batch(trajs, buckets=cfg.length_buckets, batch_size=4, pad_id=256)
    lp = np.asarray(lrn.actor_logprobs(states, batch.tokens))   # on-policy engine: ratio 1
    batch = batch.replace(rollout_logprobs=np.where(batch.action_mask, lp, 0.0).astype(np.float32))
    lp0 = lp[:, 3]
    states, m = lrn.update(states, batch)
    lp1 = np.asarray(lrn.actor_logprobs(states, batch.tokens))[:, 3]
    assert m["learner/actor_updated"] == 1 and m["actor/clip_fraction"] == 0
    assert m["actor/kl"] == pytest.approx(0.0, abs=1e-6)  # reference = policy at step 0
    np.testing.assert_allclose(m["batch/advantage_mean"], 0.0, atol=1e-5)
    assert lp1[0] > lp0[0] and lp1[1] < lp0[1]
    assert isinstance(states, LearnerStates) and states.policy_version == 1


def test_ppo_clip_ratio_is_against_the_engine_logprobs():
    """PPO clip (GRPO / VAPO baselines) takes its ratio against rollout_logprobs
    (docs/algorithm.md §7): tokens the engine sampled with a much lower
    probability than the learner now gives them (ratio > 1 + eps_high, A > 0)
    are clipped and get no gradient; with on-policy log-probs nothing is."""
    cfg = CFG.replace(advantage_estimator="grpo", policy_loss="ppo_clip", eps_low=0.2,
                      eps_high=0.28, critic_steps=0, critic_warmup_steps=0, actor_lr=1e-2)
    lrn = Learner(cfg, one_device_mesh(), make_policy(0))
    p = [257, 1, 2]
    trajs = [traj(p, [GOOD], 1.0, pid="g"), traj(p, [BAD], 0.0, pid="g"),
             traj(p, [GOOD], 1.0, pid="g"), traj(p, [BAD], 0.0, pid="g")]
    batch = make_train_batch(trajs, buckets=cfg.length_buckets, batch_size=4, pad_id=256)
    states = lrn.init_states()
    lp = np.asarray(lrn.actor_logprobs(states, batch.tokens))
    # Stale engine: GOOD rows were sampled at log-prob - 1 (ratio e > 1.28, A > 0: clipped),
    # BAD rows at the learner's own log-prob (ratio 1, A < 0: not clipped).
    shift = np.zeros_like(lp)
    shift[[0, 2], 3] = 1.0
    stale = batch.replace(rollout_logprobs=np.where(batch.action_mask, lp - shift, 0.0
                                                    ).astype(np.float32))
    states, m = lrn.update(states, stale)
    lp1 = np.asarray(lrn.actor_logprobs(states, batch.tokens))[:, 3]
    assert m["actor/clip_fraction"] == pytest.approx(0.5)
    assert lp1[1] < lp[1, 3]                       # the unclipped BAD tokens are pushed down
    on_policy = batch.replace(rollout_logprobs=np.where(batch.action_mask, lp, 0.0
                                                        ).astype(np.float32))
    _, m0 = lrn.update(lrn.init_states(), on_policy)
    assert m0["actor/clip_fraction"] == 0
    # The clipped tokens are the A > 0 ones (GOOD), the others have A < 0.
    from sao.learner.update import outcome_targets
    t = outcome_targets(stale, 0, estimator="grpo", gamma=1.0, whiten=False,
                        drop_truncated=False)
    adv = np.asarray(t["advantages"])
    assert adv[0, 3] > 0 and adv[1, 3] < 0


def test_outcome_targets_estimators():
    from sao.learner.update import outcome_targets
    trajs = [traj([257, 1], [10, 11], 1.0, pid="a"), traj([257, 1], [12], 0.0, pid="a"),
             traj([257, 2], [13], 3.0, pid="b", finish="length")]
    batch = jax.device_put(make_train_batch(trajs, buckets=(8,), batch_size=4, pad_id=256))
    kw = dict(gamma=1.0, whiten=False, drop_truncated=False)
    grpo = outcome_targets(batch, jnp.int32(2), estimator="grpo", **kw)["advantages"]
    np.testing.assert_allclose(np.asarray(grpo[0, 2:4]), [1.0, 1.0], atol=1e-5)
    np.testing.assert_allclose(float(grpo[1, 2]), -1.0, atol=1e-5)
    assert float(jnp.abs(grpo[2]).sum()) == 0  # a group of one gets 0
    rloo = outcome_targets(batch, jnp.int32(2), estimator="rloo", **kw)["advantages"]
    np.testing.assert_allclose(float(rloo[0, 2]), 1.0)
    np.testing.assert_allclose(float(rloo[1, 2]), -1.0)
    given = outcome_targets(batch, jnp.int32(2), jnp.array([0.5, -0.5, 2.0, 9.0]),
                            estimator="given", **kw)
    np.testing.assert_allclose(np.asarray(given["advantages"][:, 2]), [0.5, -0.5, 2.0, 0.0])
    assert float(given["metrics"]["batch/staleness_max"]) == 2.0
    drop = outcome_targets(batch, jnp.int32(0), jnp.ones(4), estimator="given",
                           gamma=1.0, whiten=False, drop_truncated=True)
    assert float(jnp.abs(drop["advantages"][2]).sum()) == 0
    rpp = outcome_targets(batch, jnp.int32(0), estimator="reinforce_pp", **kw)["advantages"]
    assert rpp.shape == (4, 8) and float(jnp.abs(rpp[3]).sum()) == 0


def test_seq_advantages_only_with_given(learner):
    states = learner.abstract_states()
    batch = make_train_batch([traj([1], [2], 1.0)], buckets=(8,), batch_size=4, pad_id=256)
    with pytest.raises(ValueError, match="advantage_estimator='given'"):
        learner.update(states, batch, seq_advantages=np.zeros(4))


def test_band_counts_per_lag_and_side_reach_the_metrics(learner):
    """dis/masked_{low,high}/lag{k}: rows at lags 0, 1, 2 with rollout log-probs
    put inside, below and above the band (0.5, 2.0) land in their own lag's rate."""
    states = learner.init_states()
    while int(states.policy_version) < 2:
        states, _ = learner.update(states, _hand_batch(learner, states))
    p = [257, 1, 2]
    trajs = [traj(p, [GOOD, GOOD], 1.0, version=2, pid="a"),      # lag 0: in band
             traj(p, [BAD, BAD, BAD], -1.0, version=1, pid="b"),   # lag 1: r = e^-1, low
             traj(p, [OTHER], 1.0, version=0, pid="c")]            # lag 2: r = e, high
    batch = make_train_batch(trajs, buckets=CFG.length_buckets, batch_size=4, pad_id=256)
    lp = np.asarray(learner.actor_logprobs(states, batch.tokens))
    shift = np.array([0.0, 1.0, -1.0, 0.0], np.float32)[:, None]
    batch = batch.replace(rollout_logprobs=np.where(batch.action_mask, lp + shift, 0.0)
                          .astype(np.float32))
    _, m = learner.update(states, batch)
    assert m["dis/tokens/lag0"] == 2 and m["dis/tokens/lag1"] == 3 and m["dis/tokens/lag2"] == 1
    assert m["dis/masked_low/lag0"] == 0 and m["dis/masked_high/lag0"] == 0
    assert m["dis/masked_low/lag1"] == 1 and m["dis/masked_high/lag1"] == 0
    assert m["dis/masked_low/lag2"] == 0 and m["dis/masked_high/lag2"] == 1
    assert not any(k.startswith("dis/") and "lag3" in k for k in m)
    np.testing.assert_allclose(m["actor/frac_masked_low"], 3 / 6, rtol=1e-6)
