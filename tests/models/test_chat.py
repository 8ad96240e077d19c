"""ChatML rendering to token ids (sao.models.chat)."""
import pytest

from sao.models.chat import (ChatTemplate, encode_chat, encode_message, generation_prompt,
                             template_from_jinja)
from sao.models.tokenizer import ByteTokenizer

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2? Use <python>."},
    {"role": "assistant", "content": "<python>print(2+2)</python>"},
    {"role": "tool", "content": "<output>4</output>"},
]


def test_chatml_text_and_generation_prompt():
    text = ChatTemplate().render_text(MESSAGES[:2], add_generation_prompt=True)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\n2+2? Use <python>.<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert not ChatTemplate().render_text(MESSAGES[:1], False).endswith("assistant\n")


def test_byte_tokenizer_ids_round_trip_and_keep_tool_tags():
    tok = ByteTokenizer()
    ids = encode_chat(tok, MESSAGES)
    assert tok.decode(ids) == ChatTemplate().render_text(MESSAGES)
    assert ids.count(tok.special_ids["<python>"]) == 2
    assert ids[-len(generation_prompt(tok)):] == generation_prompt(tok)


def test_conversation_is_concatenation_of_messages():
    tok = ByteTokenizer()
    parts = [i for m in MESSAGES for i in encode_message(tok, m["role"], m["content"])]
    assert encode_chat(tok, MESSAGES, add_generation_prompt=False) == parts


def test_default_system_from_jinja_template():
    src = ("{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
           "You are helpful.<|im_end|>\n' }}{% endif %}")
    tmpl = template_from_jinja(src)
    assert tmpl.default_system == "You are helpful."
    text = tmpl.render_text([{"role": "user", "content": "hi"}])
    assert text.startswith("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi")
    # An explicit system message replaces the default one.
    assert tmpl.render_text(MESSAGES[:1]).count("system") == 1
    assert template_from_jinja(None) == ChatTemplate()


def test_bad_messages():
    tok = ByteTokenizer()
    with pytest.raises(ValueError, match="role"):
        encode_chat(tok, [{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="'role' and 'content'"):
        encode_chat(tok, [{"content": "x"}])
    with pytest.raises(TypeError, match="str"):
        encode_chat(tok, [{"role": "user", "content": 3}])
    with pytest.raises(ValueError, match="ChatML"):
        template_from_jinja("[INST] {{ message }} [/INST]")
