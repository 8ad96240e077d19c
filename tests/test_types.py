"""Trajectory construction and validation (sao.types)."""
import numpy as np
import pytest

from sao.types import Trajectory, validate


def make(**kw):
    fields = dict(tokens=[1, 2, 3, 4], action_mask=[0, 0, 1, 1],
                  rollout_logprobs=[0.0, 0.0, -0.5, -1.0], policy_version=[0, 0, 1, 1],
                  reward=1.0, finish="stop", prompt_id="p", trajectory_id="t")
    fields.update(kw)
    return Trajectory(**fields)


def test_valid_trajectory_passes_and_reports_versions():
    traj = make()
    assert validate(traj, vocab_size=8, learner_version=1) is None
    assert traj.num_action_tokens == 2 and traj.oldest_version() == 1


@pytest.mark.parametrize("kw,reason", [
    (dict(tokens=[1, 2, 3]), "length_mismatch"),
    (dict(tokens=[1, 2, 3, 9]), "bad_token_id"),
    (dict(tokens=[-1, 2, 3, 4]), "bad_token_id"),
    (dict(action_mask=[0, 0, 0, 0]), "no_action_token"),
    (dict(rollout_logprobs=[0.0, 0.0, np.nan, -1.0]), "nonfinite_logprob"),
    (dict(rollout_logprobs=[np.nan, 0.0, -0.5, -1.0]), "nonfinite_logprob"),  # off the mask too
    (dict(rollout_logprobs=[0.0, 0.0, 0.5, -1.0]), "positive_logprob"),
    (dict(policy_version=[0, 0, 1, 5]), "future_version"),
    (dict(policy_version=[0, 0, -1, 1]), "negative_version"),
    (dict(finish="crashed"), "bad_finish"),
    (dict(reward=float("inf")), "nonfinite_reward"),
    (dict(tokens=[], action_mask=[], rollout_logprobs=[], policy_version=[]), "empty"),
])
def test_malformed_trajectories_get_a_reason(kw, reason):
    assert validate(make(**kw), vocab_size=8, learner_version=1) == reason


def test_tokens_that_would_wrap_or_truncate_are_refused():
    with pytest.raises(ValueError, match="int32"):
        make(tokens=np.array([1, 2, 3, 2**32 + 4], np.int64))
    with pytest.raises(ValueError, match="integer"):
        make(tokens=np.array([1.0, 2.5, 3.0, 4.0]))
    assert make(tokens=np.array([1.0, 2.0, 3.0, 4.0])).tokens.dtype == np.int32


def test_length_bound_is_the_largest_bucket():
    # A trajectory longer than every learner bucket used to pass and crash make_train_batch.
    assert validate(make(), vocab_size=8, max_length=4) is None
    assert validate(make(), vocab_size=8, max_length=3) == "too_long"


@pytest.mark.parametrize("reward,reason", [(1e30, "reward_out_of_range"),
                                           (-1e30, "reward_out_of_range"),
                                           (100.0, None), (-100.0, None),
                                           (100.5, "reward_out_of_range")])
def test_reward_bound(reward, reason):
    assert validate(make(reward=reward), vocab_size=8, max_abs_reward=100.0) == reason


def test_no_bounds_by_default():
    assert validate(make(reward=1e30, tokens=[1, 2, 3, 4]), vocab_size=8) is None
