"""HF tokenizers: tokenizer.json loading, the GGUF vocabulary rebuilt as BPE,
and ChatML ids checked against transformers' apply_chat_template."""
import json

import pytest

from sao.models import gguf_io
from sao.models.chat import encode_chat, encode_message, template_from_jinja
from sao.models.tokenizer import HFTokenizer, Tokenizer, load_hf_tokenizer


@pytest.fixture(scope="module")
def smol_meta():
    return gguf_io.read_gguf_metadata(gguf_io.find_smollm2_gguf())


@pytest.fixture(scope="module")
def smol_tok(smol_meta):
    return gguf_io.tokenizer_from_gguf(smol_meta)


def test_gguf_tokenizer_specials_and_digits(smol_tok):
    assert isinstance(smol_tok, Tokenizer)
    assert smol_tok.vocab_size == 49152
    assert (smol_tok.bos_id, smol_tok.eos_id, smol_tok.pad_id) == (1, 2, 2)
    assert smol_tok.special_ids["<|im_start|>"] == 1
    assert smol_tok.stop_ids == (2,)
    ids = smol_tok.encode("x = 12345")
    # Digits are split one per token (SmolLM2 pre-tokenizer).
    assert [smol_tok.decode([i]) for i in ids][-5:] == list("12345")
    text = "Hello <|im_start|>user\n déjà  vu\t{}\n<|im_end|>"
    ids = smol_tok.encode(text, add_bos=True)
    assert ids[0] == 1 and ids.count(1) == 2 and ids[-1] == 2
    assert smol_tok.decode(ids[1:]) == text
    assert smol_tok.decode(ids[1:], skip_special=True) == "Hello user\n déjà  vu\t{}\n"
    with pytest.raises(ValueError, match="outside"):
        smol_tok.decode([49152])


def test_chat_ids_match_transformers(smol_meta, smol_tok):
    from transformers import PreTrainedTokenizerFast

    source = smol_meta["tokenizer.chat_template"]
    hf = PreTrainedTokenizerFast(tokenizer_object=smol_tok.tok, chat_template=source)
    tmpl = template_from_jinja(source)
    assert tmpl.default_system.startswith("You are a helpful AI assistant named SmolLM")
    msgs = [{"role": "user", "content": "What is 17*3? Think."},
            {"role": "assistant", "content": "51"}, {"role": "user", "content": "12 + 7 ="}]
    for gen in (True, False):
        want = hf.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=True)
        want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
        assert encode_chat(smol_tok, msgs, add_generation_prompt=gen, template=tmpl) == list(want)
    # Appending turn by turn gives the same ids as rendering the whole conversation.
    full = encode_chat(smol_tok, msgs, add_generation_prompt=False)
    assert full == [i for m in msgs for i in encode_message(smol_tok, m["role"], m["content"])]


def test_tokenizer_json_round_trip(tmp_path, smol_tok):
    smol_tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}))
    tok = load_hf_tokenizer(str(tmp_path), vocab_size=49160)
    assert isinstance(tok, HFTokenizer)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (1, 2, 2, 49160)
    text = "def f(x):\n    return x ** 2  # 100 <|im_end|>"
    assert tok.encode(text) == smol_tok.encode(text)
    assert tok.decode([49155]) == ""  # embedding padding row: no text
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_hf_tokenizer(str(tmp_path / "missing"))


def test_gguf_tokenizer_rejects_other_models():
    with pytest.raises(ValueError, match="gpt2"):
        gguf_io.tokenizer_from_gguf({"tokenizer.ggml.model": "llama"})
