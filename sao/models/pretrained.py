"""`from_pretrained`: a model and its tokenizer from a Hugging Face directory
or a Llama GGUF file, chosen by the path (docs/models.md).

A ``.gguf`` file goes to `sao.models.gguf_io.load_gguf_model`, anything else
to `sao.models.hf.load_hf_model`. A ``gs://`` path is first copied once into
a local cache (``sao.storage.local_copy``). With a mesh, every parameter is
created straight on it with its rule's sharding (`sao.models.hf.build_model`). Writing back is
`sao.models.hf.save_pretrained` (HF) or `sao.models.gguf_io.write_gguf`.
"""
from __future__ import annotations

import os

from sao import storage
from sao.models.gguf_io import load_gguf_model
from sao.models.hf import load_hf_model


def from_pretrained(path: str, *, dtype: str = "float32", mesh=None):
    """Loads ``(cfg, model, tokenizer)`` from a HF directory or a ``.gguf`` file.

    Args:
      path: directory with ``config.json`` and ``model.safetensors`` (or a
        sharded index) for Qwen3 / Qwen3-MoE / Llama; or a Llama ``.gguf``
        file (dequantized to float32, q/k RoPE permutation undone); local or
        ``gs://`` (downloaded once into ``sao.storage.default_cache_dir()``).
      dtype: "float32" or "bfloat16", parameter and compute dtype.
      mesh: optional ``jax.sharding.Mesh``; each parameter is created on it
        with the sharding its logical axes name (each device receives only
        its slice; in a multi-process job every process reads the files and
        places its own devices' slices).
    Returns:
      ``(ModelConfig, Transformer, tokenizer)``; the tokenizer is None when
      a directory has no ``tokenizer.json``.
    Raises:
      FileNotFoundError: missing files; ValueError: unsupported architecture
      or weights that do not match the config; ``sao.storage.StorageError``:
      a ``gs://`` path without gcsfs or credentials.
    """
    path = storage.local_copy(path)
    if os.path.isfile(path) and path.endswith(".gguf"):
        return load_gguf_model(path, dtype=dtype, mesh=mesh)
    return load_hf_model(path, dtype=dtype, mesh=mesh)
