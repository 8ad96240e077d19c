"""GGUF: RoPE row permutation, export/import round trip, errors."""
import numpy as np
import pytest

from sao.models import from_pretrained, gguf_io, hf
from sao.models.config import ModelConfig
from sao.models.tokenizer import ByteTokenizer

CFG = ModelConfig(arch="llama", qk_norm=False, vocab_size=272, hidden_size=32, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48,
                  rope_theta=10_000.0, rms_norm_eps=1e-5)


def test_permutation_matches_llama_cpp_layout():
    # One head of 4 rows (rotary pairs (0, 2) and (1, 3) in HF's half split)
    # becomes interleaved: rows 0, 2, 1, 3.
    w = np.arange(8 * 2).reshape(8, 2)
    p = gguf_io.permute_rope_rows(w, n_heads=2)
    np.testing.assert_array_equal(p[:4, 0], w[[0, 2, 1, 3], 0])
    np.testing.assert_array_equal(p[4:, 0], w[[4, 6, 5, 7], 0])
    np.testing.assert_array_equal(gguf_io.unpermute_rope_rows(p, 2), w)
    with pytest.raises(ValueError, match="heads of even size"):
        gguf_io.permute_rope_rows(np.zeros((6, 2)), n_heads=2)


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_is_exact(tmp_path, tied):
    cfg = CFG.replace(tie_word_embeddings=tied)
    model = hf.build_model(cfg, hf.random_params(cfg, 7))
    path = str(tmp_path / "m.gguf")
    gguf_io.write_gguf(model, cfg, path, ByteTokenizer())
    meta, state = gguf_io.read_gguf(path)
    assert meta["general.architecture"] == "llama"
    assert ("lm_head.weight" in state) != tied
    cfg2, model2, tok = from_pretrained(path)
    assert cfg2 == cfg
    a, b = hf.model_params(model), hf.model_params(model2)
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=str(k))
    # The file stores q/k rows permuted (llama.cpp layout); reading un-permutes them.
    import gguf

    raw = {t.name: np.asarray(t.data).reshape(list(reversed(t.shape.tolist())))
           for t in gguf.GGUFReader(path).tensors}
    hf_state = hf.params_to_hf(cfg, a)
    for name, heads in (("q", cfg.num_heads), ("k", cfg.num_kv_heads)):
        hf_w = hf_state[f"model.layers.1.self_attn.{name}_proj.weight"]
        np.testing.assert_array_equal(raw[f"blk.1.attn_{name}.weight"],
                                      gguf_io.permute_rope_rows(hf_w, heads))
        assert not np.array_equal(raw[f"blk.1.attn_{name}.weight"], hf_w)
        np.testing.assert_array_equal(state[f"model.layers.1.self_attn.{name}_proj.weight"], hf_w)
    byte = ByteTokenizer()
    text = "1+1=<answer>2</answer>é"
    assert tok.encode(text) == byte.encode(text)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (257, 258, 256, 272)


def test_errors(tmp_path):
    qwen = CFG.replace(arch="qwen3", qk_norm=True)
    with pytest.raises(ValueError, match="llama"):
        gguf_io.write_gguf(hf.build_model(qwen, hf.random_params(qwen, 0)), qwen,
                           str(tmp_path / "q.gguf"), ByteTokenizer())
    small = CFG.replace(vocab_size=200)
    with pytest.raises(ValueError, match="vocab_size"):
        gguf_io.write_gguf(hf.build_model(small, hf.random_params(small, 0)), small,
                           str(tmp_path / "s.gguf"), ByteTokenizer())
