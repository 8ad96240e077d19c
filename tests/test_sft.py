"""sao.sft: batch widths, and padding after the rows changes neither the loss nor the update."""
import jax
import numpy as np
import pytest
from flax import nnx

from sao import sft
from sao.data.demonstrations import SFTArrays
from sao.models import Transformer, get_preset


def test_batch_width():
    assert [sft.batch_width(n, 128, 16) for n in (0, 1, 16, 17, 47, 64, 87, 112, 113, 128)] == \
        [16, 16, 16, 32, 48, 64, 96, 112, 128, 128]
    assert sft.batch_width(100, 100, 16) == 100                 # never past max_len
    for bad in ((10, 128, 0), (129, 128, 16), (-1, 128, 16)):
        with pytest.raises(ValueError):
            sft.batch_width(*bad)


def data(n=24, max_len=64, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(6, 30, n).astype(np.int32)
    tokens = np.zeros((n, max_len), np.int32)
    loss_mask = np.zeros((n, max_len), bool)
    for i, length in enumerate(lengths):
        tokens[i, :length] = rng.integers(1, 200, length)
        loss_mask[i, length // 2:length] = True             # the "answer" half of each row
    return SFTArrays(tokens, loss_mask, lengths, np.ones(n, bool))


def test_padding_after_the_rows_changes_nothing():
    # The same 5 steps at widths cut to 16-multiples and at the full 64: same losses and weights.
    out = {}
    for multiple in (16, 64):
        model = Transformer(get_preset("tiny"), rngs=nnx.Rngs(0))
        losses = []
        res = sft.train_sft(model, data(), steps=5, batch_size=4, lr=1e-2, warmup_steps=1, seed=1,
                            pad_multiple=multiple, log=lambda s, m: losses.append(m["sft/loss"]),
                            log_every=1)
        out[multiple] = (losses, res["sft/loss"], nnx.state(model, nnx.Param))
    np.testing.assert_allclose(out[16][0], out[64][0], rtol=1e-5)
    assert out[16][1] == pytest.approx(out[64][1], rel=1e-5)
    for a, b in zip(jax.tree.leaves(out[16][2]), jax.tree.leaves(out[64][2])):   # Adam moves each
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)  # weight ~5e-2
