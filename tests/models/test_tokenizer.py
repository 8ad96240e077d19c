"""Byte-level tokenizer of the tiny preset (docs/architecture.md)."""
import pytest
from hypothesis import given, settings, strategies as st

from sao.models.tokenizer import BYTE_SPECIAL_TOKENS, ByteTokenizer, Tokenizer


def test_layout_matches_architecture_doc():
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer)
    assert tok.vocab_size == 272
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (256, 257, 258)
    assert tok.special_ids == {
        "<pad>": 256, "<bos>": 257, "<eos>": 258, "<python>": 259, "</python>": 260,
        "<output>": 261, "</output>": 262, "<answer>": 263, "</answer>": 264}
    assert tok.stop_ids == (258,)


def test_bytes_and_tags():
    tok = ByteTokenizer()
    assert tok.encode("ab") == [97, 98]
    assert tok.encode("é") == [0xC3, 0xA9]
    assert tok.encode("x<python>print(1)</python>", add_bos=True) == (
        [257, 120, 259] + list(b"print(1)") + [260])
    # A tag inside a longer word is still a tag; a broken tag is bytes.
    assert tok.encode("a<answer>7</answer>b") == [97, 263, 55, 264, 98]
    assert tok.encode("<answer") == list(b"<answer")


def test_decode_specials_and_skip():
    tok = ByteTokenizer()
    ids = [257] + list(b"hi") + [263, 52, 264, 258]
    assert tok.decode(ids) == "<bos>hi<answer>4</answer><eos>"
    assert tok.decode(ids, skip_special=True) == "hi4"
    assert tok.decode([104, 265, 271, 105]) == "hi"  # unused padding ids


def test_invalid_utf8_is_replaced():
    tok = ByteTokenizer()
    assert tok.decode([0xFF, 97]) == "\ufffda"
    # A multi-byte character cut by a special token is replaced, not lost silently.
    assert tok.decode([0xC3, 259, 0xA9]) == "\ufffd<python>\ufffd"


def test_bad_input_errors():
    tok = ByteTokenizer()
    with pytest.raises(ValueError, match="outside"):
        tok.decode([272])
    with pytest.raises(ValueError, match="outside"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="str"):
        tok.encode(b"bytes")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=20), st.sampled_from(BYTE_SPECIAL_TOKENS)),
                max_size=8))
def test_round_trip(pieces):
    tok = ByteTokenizer()
    text = "".join(pieces)
    ids = tok.encode(text)
    assert all(0 <= i < 265 for i in ids)
    assert tok.decode(ids) == text


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=20), st.sampled_from(BYTE_SPECIAL_TOKENS)),
                max_size=6))
def test_tokenizers_export_is_the_same_tokenizer(pieces):
    tok = ByteTokenizer()
    hf = _hf_byte_tokenizer()
    text = "".join(pieces)
    assert hf.encode(text, add_special_tokens=False).ids == tok.encode(text)
    ids = tok.encode(text)
    assert hf.decode(ids, skip_special_tokens=False) == tok.decode(ids)


def test_save_hf_tokenizer_loads_back(tmp_path):
    from sao.models.tokenizer import load_hf_tokenizer, save_hf_tokenizer

    save_hf_tokenizer(ByteTokenizer(), str(tmp_path))
    back = load_hf_tokenizer(str(tmp_path), vocab_size=272)
    assert (back.pad_id, back.bos_id, back.eos_id) == (256, 257, 258)
    text = "héllo <python>x=1</python><eos>"
    assert back.encode(text) == ByteTokenizer().encode(text)
    assert back.decode([0xFF, 97]) == "\ufffda"
    with pytest.raises(TypeError, match="cannot export"):
        save_hf_tokenizer(object(), str(tmp_path))


_HF = []


def _hf_byte_tokenizer():
    if not _HF:
        _HF.append(ByteTokenizer().to_tokenizers())
    return _HF[0]
