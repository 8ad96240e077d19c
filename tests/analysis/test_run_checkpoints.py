"""sao.analysis.run_checkpoints: the experiment config as sao.main parses it, a run without
checkpoints refused, buffered fleet trajectories decoded from a checkpoint's data state.
(Restoring and sampling a real run: tests/notebooks/test_trajectory_viewer_notebook.py.)"""
import base64
import os

import numpy as np
import pytest

from sao import run_metrics
from sao.analysis import CheckpointedRun, experiment_config, run_config
from sao.ckpt import Restored
from sao.rpc import codec
from sao.types import Trajectory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(ROOT, "experiments", "quickstart.py")


def test_experiment_config_with_overrides_and_variant():
    base = experiment_config(QUICKSTART)          # puts the repository root on sys.path
    from experiments import quickstart
    assert base.to_dict() == quickstart.get_config().to_dict()
    cfg = experiment_config(QUICKSTART + ":1", ["--config.learner.batch_size=8",
                                                "rollout.max_len=96"])
    assert (cfg.seed, cfg.learner.batch_size, cfg.rollout.max_len) == (1, 8, 96)
    assert cfg.is_locked
    with pytest.raises(FileNotFoundError, match="no experiment file"):
        experiment_config(os.path.join(ROOT, "experiments", "absent.py"))
    with pytest.raises(Exception, match="not_a_field"):
        experiment_config(QUICKSTART, ["--config.learner.not_a_field=1"])


def test_a_directory_without_checkpoints_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no ckpt/"):
        CheckpointedRun(experiment_config(QUICKSTART), str(tmp_path))
    assert not (tmp_path / "ckpt").exists()                    # nothing created


def _traj(i):
    mask = np.array([False, True, True])
    return Trajectory(tokens=np.array([257, i, i + 1]), action_mask=mask,
                      rollout_logprobs=np.where(mask, -1.0, 0.0), policy_version=np.array([0, 2, 2]),
                      reward=float(i), finish="stop", prompt_id=f"p{i}", trajectory_id=f"t{i}")


def test_buffered_decodes_the_dispatcher_state():
    encoded = [base64.b64encode(codec.encode(_traj(i))).decode() for i in (1, 2)]
    restored = Restored(step=3, train_state=None, rng=None, policy_version=2,
                        data_state={"dispatcher": {"buffer": encoded}, "prompts": {}},
                        buffer=[_traj(0)], extra={})
    out = CheckpointedRun.buffered(restored)
    assert [t.trajectory_id for t in out] == ["t0", "t1", "t2"]
    np.testing.assert_array_equal(out[2].tokens, [257, 2, 3])
    np.testing.assert_array_equal(out[2].policy_version, [0, 2, 2])
    empty = Restored(step=0, train_state=None, rng=None, policy_version=0, data_state=None,
                     buffer=[], extra={})
    assert CheckpointedRun.buffered(empty) == []


def test_run_config_reads_what_the_run_recorded(tmp_path):
    cfg = experiment_config(QUICKSTART + ":1", ["--config.learner.batch_size=8"])
    with pytest.raises(FileNotFoundError, match="config.json"):
        run_config(str(tmp_path))
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):      # cfg=None: the recorded one
        CheckpointedRun(None, str(tmp_path))
    run_metrics.write_json(str(tmp_path / run_metrics.CONFIG_FILE), cfg.to_dict())  # as sao.train does
    back = run_config(str(tmp_path))
    assert back.to_dict() == cfg.to_dict() and back.is_locked
    assert back.learner.length_buckets == (96, 128) and isinstance(back.env.tasks, tuple)
