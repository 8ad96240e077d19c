"""TrainBatch: buckets, padding rows, reward placement, micro-batch split."""
import numpy as np
import pytest

from sao.learner.batch import make_train_batch, pick_bucket
from sao.learner.steps import micro_split

from .helpers import traj


def test_pick_bucket():
    assert pick_bucket(5, (16, 8, 32)) == 8
    assert pick_bucket(8, (8, 16)) == 8
    assert pick_bucket(9, (8, 16)) == 16
    with pytest.raises(ValueError, match="largest length bucket 16"):
        pick_bucket(17, (8, 16))
    with pytest.raises(ValueError, match="empty"):
        pick_bucket(3, ())


def test_make_train_batch_pads_rows_and_places_reward():
    a = traj([257, 1, 2], [10, 11], 1.5, obs=[5, 6, 7], logprob=-0.5, version=3)
    b = traj([257, 4], [20], -1.0, finish="length", pid="same")
    c = traj([257, 9], [21, 22], 2.0, pid="same")
    batch = make_train_batch([a, b, c], buckets=(4, 8, 16), batch_size=4, pad_id=256)
    assert batch.shape == (4, 16)  # longest is 9 tokens -> bucket 16
    assert batch.tokens.dtype == np.int32 and batch.rewards.dtype == np.float32
    np.testing.assert_array_equal(batch.tokens[0, :9], [257, 1, 2, 10, 11, 5, 6, 7, 11])
    assert (batch.tokens[0, 9:] == 256).all() and (batch.tokens[3] == 256).all()
    # reward on the last action token only
    assert batch.rewards[0, 8] == 1.5 and batch.rewards[0].sum() == 1.5
    assert batch.rewards[1, 2] == -1.0 and batch.rewards[2, 3] == 2.0
    np.testing.assert_array_equal(batch.row_mask, [1, 1, 1, 0])
    np.testing.assert_array_equal(batch.truncated, [False, True, False, False])
    np.testing.assert_array_equal(batch.lengths, [9, 3, 4, 0])
    # rows sharing a prompt id share a group; padding is group -1
    assert batch.group_ids[1] == batch.group_ids[2] != batch.group_ids[0]
    assert batch.group_ids[3] == -1
    assert not batch.action_mask[3].any() and (batch.policy_version[3] == -1).all()
    np.testing.assert_array_equal(batch.rollout_logprobs[0, :9],
                                  [0, 0, 0, -0.5, -0.5, 0, 0, 0, -0.5])
    assert (batch.policy_version[0, :9] == 3).all()


def test_make_train_batch_rejects_bad_input():
    t = traj([1, 2], [3], 1.0)
    with pytest.raises(ValueError, match="at least one"):
        make_train_batch([], buckets=(8,), batch_size=2, pad_id=0)
    with pytest.raises(ValueError, match="do not fit batch_size"):
        make_train_batch([t, t, t], buckets=(8,), batch_size=2, pad_id=0)
    with pytest.raises(ValueError, match="exceeds the largest"):
        make_train_batch([t], buckets=(2,), batch_size=2, pad_id=0)
    t.rollout_logprobs = t.rollout_logprobs[:-1]
    with pytest.raises(ValueError, match="different lengths"):
        make_train_batch([t], buckets=(8,), batch_size=2, pad_id=0)


def test_trajectory_without_action_tokens_contributes_nothing():
    t = traj([1, 2, 3], [], 5.0)
    batch = make_train_batch([t], buckets=(8,), batch_size=2, pad_id=0)
    assert not batch.action_mask.any() and batch.rewards.sum() == 0


def test_micro_split_interleaves_rows():
    x = np.arange(8)[:, None] * np.ones((1, 3))
    out = np.asarray(micro_split(x, 2))
    assert out.shape == (2, 4, 3)
    np.testing.assert_array_equal(out[0, :, 0], [0, 2, 4, 6])
    np.testing.assert_array_equal(out[1, :, 0], [1, 3, 5, 7])


def test_group_ids_follow_prompt_and_epoch():
    rows = [traj([257, 1], [10], 1.0, pid="p") for _ in range(4)]
    rows[1].group = 1                      # same prompt, same epoch: one GRPO group
    rows[2].epoch = rows[3].epoch = 1      # the prompt again in the next epoch: another group
    rows[3].group = 1
    batch = make_train_batch(rows, buckets=(8,), batch_size=4, pad_id=256)
    np.testing.assert_array_equal(batch.group_ids, [0, 0, 1, 1])
