"""Tokenizer-only loading: the tokenizer of an HF directory or a GGUF file,
without reading the weights.

A rollout worker, the agent loop and the learner's data pipeline need the
tokenizer (and the chat template it carries) long before, or without ever,
needing the weights: loading a whole checkpoint for it costs the model's
size in memory and seconds to minutes of reading. The result is what
``sao.models.from_pretrained(path)[2]`` returns, ``vocab_size`` included
(the embedding's rows, from ``config.json`` or the GGUF metadata).
"""
from __future__ import annotations

import json
import os

from sao.models import gguf_io
from sao.models.tokenizer import HFTokenizer, load_hf_tokenizer

CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where recent transformers save the template


def load_tokenizer(path: str) -> HFTokenizer:
    """The tokenizer of the model at ``path``; no weight is read.

    Args:
      path: an HF model directory (``tokenizer.json``, optional
        ``tokenizer_config.json``, ``config.json`` for ``vocab_size``, optional
        ``chat_template.jinja`` when the config holds no template) or a
        ``.gguf`` file (vocabulary, merges, special ids and chat template from
        its metadata; tensors are not read).
    Returns:
      ``HFTokenizer`` whose ``vocab_size`` is the model's (the tokenizer's own
      size when an HF directory has no ``config.json``).
    Raises:
      FileNotFoundError: ``path`` is neither a ``.gguf`` file nor a directory
        with ``tokenizer.json``.
      ValueError: a tokenizer this loader cannot rebuild (see
        ``sao.models.gguf_io.tokenizer_from_gguf``) or no eos token.
    """
    if os.path.isfile(path) and path.endswith(".gguf"):
        meta = gguf_io.read_gguf_metadata(path)
        vocab_size = gguf_io.hf_config_from_gguf(meta)["vocab_size"]
        return gguf_io.tokenizer_from_gguf(meta, vocab_size=vocab_size)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is neither a .gguf file nor a model directory")
    vocab_size = None
    cfg_path = os.path.join(path, "config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            vocab_size = json.load(f).get("vocab_size")
    tok = load_hf_tokenizer(path, vocab_size=vocab_size)
    template_path = os.path.join(path, CHAT_TEMPLATE_FILE)
    if tok.chat_template is None and os.path.exists(template_path):
        with open(template_path, encoding="utf-8") as f:
            tok.chat_template = f.read()
    return tok
