"""Replay: the recorded stream re-feeds a deterministic learner bit-identically."""
import numpy as np
import pytest

from sao.fleet import sim
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
from sao.fleet.replay import Recorder, ReplaySource, ReplayWriter, read_batches

from . import tiny_learner
from .helpers import VOCAB, good_trajectory, sim_workers

B = 4


def train(source, steps=None):
    params, n = tiny_learner.init(VOCAB), 0
    while (steps is None or n < steps) and (batch := source.get_batch(timeout=60)):
        params = tiny_learner.update(params, batch, batch_size=B)
        n += 1
        source.push_weights(source.learner_version + 1, f"ckpt/{n}")
    return np.asarray(params), n


def test_replay_reproduces_parameters_bit_identically(tmp_path):
    path = tmp_path / "run" / "replay.bin"
    ps = sim.lognormal_prompts(24, median=20, sigma=1.0, seed=5, max_len=200)
    cfg = DispatcherConfig(batch_size=B, vocab_size=VOCAB, tau=2)
    with sim_workers(2) as ws, Dispatcher([w.address for w in ws], ps, cfg) as d:
        rec = Recorder(d, path)
        live, steps = train(rec)
        rec.close()
        assert rec.snapshot()["trained"] == sum(len(b.trajectories) for b in read_batches(path))
    replayed, steps2 = train(ReplaySource(path))
    assert steps2 == steps >= 4
    assert replayed.tobytes() == live.tobytes()
    assert not np.array_equal(live, tiny_learner.init(VOCAB))


def test_replay_detects_divergence(tmp_path):
    with ReplayWriter(tmp_path / "r.bin") as w:
        w.write_batch([good_trajectory("a")], learner_version=0)
        w.write_batch([good_trajectory("b")], learner_version=1)
    src = ReplaySource(tmp_path / "r.bin")
    assert [t.prompt_id for t in src.get_batch()] == ["a"]
    with pytest.raises(ValueError, match="diverged"):
        src.get_batch()  # the learner never published version 1


def test_torn_tail_is_ignored_and_cut_on_reopen(tmp_path):
    path = tmp_path / "r.bin"
    with ReplayWriter(path) as w:
        w.write_batch([good_trajectory("a"), good_trajectory("b")], learner_version=0)
        w.write_batch([good_trajectory("c")], learner_version=1)
    whole = path.read_bytes()
    for cut in (len(whole) - 1, len(whole) - 7, len(whole) - 60):
        path.write_bytes(whole[:cut])          # a crash in the middle of batch 2
        assert [b.step for b in read_batches(path)] == [0]
    path.write_bytes(whole[:-3] + b"\xff\xff\xff")  # a corrupt checksum
    assert [b.step for b in read_batches(path)] == [0]
    with ReplayWriter(path) as w:             # reopen: the torn batch is cut, appending resumes
        assert w.steps == 1
        w.write_batch([good_trajectory("d")], learner_version=1)
    batches = list(read_batches(path))
    assert [(b.step, [t.prompt_id for t in b.trajectories]) for b in batches] == \
        [(0, ["a", "b"]), (1, ["d"])]
    np.testing.assert_array_equal(batches[1].trajectories[0].tokens, good_trajectory("d").tokens)
