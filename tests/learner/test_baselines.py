"""Host-side running-mean baseline vs hand-computed advantages; checkpoint round trip."""
import json

import numpy as np
import pytest

from sao.learner.baselines import RunningMeanBaseline

from .helpers import traj


def test_one_slot_per_prompt_across_epochs_and_groups():
    # Rollouts of p3 in epochs 0 and 2, group members 0 and 1: one prompt, one slot.
    rows = [traj([1], [2], r, pid="p3") for r in (1.0, 0.0, 1.0)]
    rows[1].epoch, rows[2].epoch, rows[2].group = 2, 2, 1
    b = RunningMeanBaseline(window=4)
    np.testing.assert_allclose(b(rows[:1]), [1.0])
    np.testing.assert_allclose(b(rows[1:]), [-1.0, 0.0])    # both against p3's mean 1.0
    assert b.slots == {"p3": 0}


def test_per_prompt_window_hand_computed():
    b = RunningMeanBaseline(window=2, scope="prompt", default_baseline=0.0)
    # Step 1: no history, baseline 0; the batch never sees its own rewards; padding rows are 0.
    adv = b.advantages(["a", "b", "a"], [1.0, 0.0, 0.0], batch_size=4)
    np.testing.assert_allclose(adv, [1.0, 0.0, 0.0, 0.0])
    # a's buffer [1, 0] -> mean 0.5; b's [0] -> 0; c unseen -> 0.
    adv = b.advantages(["a", "b", "c"], [1.0, 1.0, 1.0])
    np.testing.assert_allclose(adv, [0.5, 1.0, 1.0])
    # Window 2 keeps the last two rewards: a saw 1, 0, 1, then 0 -> [1, 0], mean 0.5; b [0, 1] -> 0.5.
    np.testing.assert_allclose(b.advantages(["a"], [0.0]), [-0.5])   # a: last two (0, 1)
    adv = b.advantages(["a", "b"], [0.0, 0.0])
    np.testing.assert_allclose(adv, [-0.5, -0.5])
    assert b.slots == {"a": 0, "b": 1, "c": 2}


def test_global_scope_one_slot():
    b = RunningMeanBaseline(window=3, scope="global", default_baseline=0.25)
    np.testing.assert_allclose(b.advantages(["a", "b"], [1.0, 0.0]), [0.75, -0.25])
    np.testing.assert_allclose(b.advantages(["c"], [0.0]), [-0.5])          # mean(1, 0)
    np.testing.assert_allclose(b.advantages(["d"], [1.0]), [1.0 - 1.0 / 3])  # mean(1, 0, 0)
    assert len(b.slots) == 1


def test_state_dict_round_trip_through_json():
    b = RunningMeanBaseline(window=4)
    b.advantages(["a", "b", "a"], [1.0, 0.5, 0.0])
    c = RunningMeanBaseline(window=4)
    c.load_state_dict(json.loads(json.dumps(b.state_dict())))
    np.testing.assert_array_equal(b.advantages(["a", "b", "z"], [1.0, 1.0, 1.0]),
                                  c.advantages(["a", "b", "z"], [1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="window"):
        RunningMeanBaseline(window=8).load_state_dict(b.state_dict())
    with pytest.raises(ValueError, match="scope"):
        RunningMeanBaseline(window=8, scope="per-row")
