"""sao.analysis.update_probe: a learner step's effect on the log-likelihood of solved and
unsolved episodes, of its batch and of episodes it was not trained on."""
import jax
import numpy as np
import pytest
from flax import nnx

from sao.analysis.update_probe import sequence_logprobs, update_effect
from sao.learner.config import LearnerConfig
from sao.learner.learner import Learner
from sao.learner.mesh import mesh_from_config
from sao.models import Transformer, get_preset
from sao.types import Trajectory

MODEL = get_preset("tiny", hidden_size=64, intermediate_size=128, num_heads=2, num_kv_heads=1,
                   num_layers=1)
# GRPO (critic-free), groups = prompt ids; a large rate so that one step shows.
CFG = LearnerConfig(batch_size=4, length_buckets=(8,), advantage_estimator="grpo",
                    critic_steps=0, critic_warmup_steps=0, actor_lr=1e-2, eps_low=0.5,
                    eps_high=1.0)
GOOD, BAD = 10, 20


def _learner():
    mesh = mesh_from_config({"data": 1}, devices=jax.devices()[:1])
    return Learner(CFG, mesh, lambda: Transformer(MODEL, rngs=nnx.Rngs(0)))


def _episode(learner, states, action, reward, pid, prompt=(257, 1, 2)):
    tokens = np.array([*prompt, action])
    mask = np.array([False] * len(prompt) + [True])
    ep = Trajectory(tokens=tokens, action_mask=mask, rollout_logprobs=np.zeros(len(tokens)),
                    policy_version=np.zeros(len(tokens)), reward=reward, finish="stop",
                    prompt_id=pid, trajectory_id=f"{pid}-{action}-{reward}")
    lp = sequence_logprobs(learner, states, [ep])[0]       # an on-policy engine: ratio 1
    return Trajectory(**{**ep.__dict__, "rollout_logprobs": np.where(mask, lp, 0.0)})


def test_a_step_pushes_solved_up_and_unsolved_down_and_measures_the_rest():
    learner = _learner()
    states = learner.init_states()
    batch = [_episode(learner, states, a, r, "g") for a, r in
             ((GOOD, 1.0), (BAD, 0.0), (GOOD, 1.0), (BAD, 0.0))]
    held = [_episode(learner, states, GOOD, 1.0, "h", prompt=(257, 3, 4)),
            _episode(learner, states, BAD, 0.0, "h", prompt=(257, 3, 4))]
    before = sequence_logprobs(learner, states, batch + held)    # 6 episodes: two chunks of 4
    per_token = np.asarray(learner.actor_logprobs(states, np.array([e.tokens for e in batch])))
    np.testing.assert_allclose(before[:4], per_token[:, 3], rtol=1e-6)   # the action token only
    np.testing.assert_allclose(before, [sequence_logprobs(learner, states, [e])[0]
                                        for e in batch + held], rtol=1e-6)
    states, rows = update_effect(learner, states, batch, held_out=held, updates=2)
    assert [r["update"] for r in rows] == [1, 2]
    first, second = ({k.removeprefix("logp_change/"): v for k, v in r.items()} for r in rows)
    assert first["batch/solved"] > 0 > first["batch/unsolved"]
    assert second["batch/solved"] > first["batch/solved"]            # changes since the start
    assert second["batch/unsolved"] < first["batch/unsolved"]
    assert first["batch/solved_min"] == pytest.approx(first["batch/solved"])   # one episode twice
    assert np.isfinite([first["held_out/solved"], first["held_out/unsolved"]]).all()
    assert first["learner/actor_updated"] == 1.0 and "actor/grad_norm" in first
    after = sequence_logprobs(learner, states, batch + held)
    np.testing.assert_allclose(after[:4] - before[:4],
                               [second["batch/solved"], second["batch/unsolved"]] * 2, atol=1e-5)
    np.testing.assert_allclose(after[4:] - before[4:],
                               [second["held_out/solved"], second["held_out/unsolved"]], atol=1e-5)


def test_held_out_episodes_are_not_trained_on_and_bad_calls_are_refused():
    learner = _learner()
    s0 = learner.init_states()
    batch = [_episode(learner, s0, GOOD, 1.0, "g"), _episode(learner, s0, BAD, 0.0, "g")]
    held = [_episode(learner, s0, BAD, 1.0, "g")]        # would change the group's advantages
    s1, with_held = update_effect(learner, learner.init_states(), batch, held_out=held)
    s2, without = update_effect(learner, learner.init_states(), batch)
    for a, b in zip(jax.tree.leaves(s1.actor.params), jax.tree.leaves(s2.actor.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))   # held_out trains nothing
    assert "logp_change/held_out/solved" not in without[0]
    assert np.isnan(with_held[0]["logp_change/held_out/unsolved"])        # none unsolved
    with pytest.raises(ValueError, match="updates must be >= 1"):
        update_effect(learner, learner.init_states(), batch, updates=0)
    with pytest.raises(ValueError, match="1..4 episodes"):
        update_effect(learner, learner.init_states(), batch * 3)
