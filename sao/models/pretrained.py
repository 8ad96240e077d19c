"""`from_pretrained`: a model and its tokenizer from a Hugging Face directory
or a Llama GGUF file, chosen by the path (docs/models.md).

A ``.gguf`` file goes to `sao.models.gguf_io.load_gguf_model`, anything else
to `sao.models.hf.load_hf_model`. Writing back is
`sao.models.hf.save_pretrained` (HF) or `sao.models.gguf_io.write_gguf`.
"""
from __future__ import annotations

import os

from sao.models.gguf_io import load_gguf_model
from sao.models.hf import load_hf_model


def from_pretrained(path: str, *, dtype: str = "float32", mesh=None):
    """Loads ``(cfg, model, tokenizer)`` from a HF directory or a ``.gguf`` file.

    Args:
      path: directory with ``config.json`` and ``model.safetensors`` (or a
        sharded index) for Qwen3 / Qwen3-MoE / Llama; or a Llama ``.gguf``
        file (dequantized to float32, q/k RoPE permutation undone).
      dtype: "float32" or "bfloat16", parameter and compute dtype.
      mesh: optional ``jax.sharding.Mesh``; parameters are placed by the
        sharding rules.
    Returns:
      ``(ModelConfig, Transformer, tokenizer)``; the tokenizer is None when
      a directory has no ``tokenizer.json``.
    Raises:
      FileNotFoundError: missing files; ValueError: unsupported architecture
      or weights that do not match the config.
    """
    if os.path.isfile(path) and path.endswith(".gguf"):
        return load_gguf_model(path, dtype=dtype, mesh=mesh)
    return load_hf_model(path, dtype=dtype, mesh=mesh)
