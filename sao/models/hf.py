"""Hugging Face format import/export: ``config.json`` + safetensors.

`load_hf_model(path)` loads a HF directory (``model.safetensors`` or a
sharded ``model.safetensors.index.json``) of ``Qwen3ForCausalLM``,
``Qwen3MoeForCausalLM`` or ``LlamaForCausalLM`` and returns ``(cfg, model,
tokenizer)``; ``sao.models.from_pretrained`` calls it for directories and
:mod:`sao.models.gguf_io` (built on this module's mapping) for ``.gguf``
files. `save_pretrained` writes the same HF layout back; it is how weights reach an
SGLang fleet, so the files follow the Hub checkpoints (per-expert MoE
tensors ``mlp.experts.{e}.gate_proj.weight``, ``lm_head.weight`` omitted when
embeddings are tied).

Layouts (HF ``nn.Linear.weight`` is ``[out, in]``; see transformer.py):
``q_proj.weight [H*hd, D] -> kernel [D, H, hd]``, ``o_proj.weight [D, H*hd] ->
kernel [H, hd, D]``, MLP/router/lm_head ``kernel = weight.T``, experts stacked
on a leading ``E`` axis. Conversion is a pure permutation/reshape, so
``import(export(x))`` is bit-exact.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file  # host arrays as they are: no device round trip

from sao.models.config import ModelConfig
from sao.models.sharding import state_shardings
from sao.models.tokenizer import load_hf_tokenizer, save_hf_tokenizer
from sao.models.transformer import Transformer

_ARCH_NAMES = {
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
    "llama": ("LlamaForCausalLM", "llama"),
}
_MODEL_TYPES = {model_type: arch for arch, (_, model_type) in _ARCH_NAMES.items()}
DTYPES = ("float32", "bfloat16")


# ----------------------------------------------------------------------------- config


def _rope_theta(hf: Mapping) -> float:
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"RoPE scaling {kind!r} is not supported (only default RoPE)")
    theta = hf.get("rope_theta", rope.get("rope_theta"))
    return float(theta if theta is not None else 10000.0)


def config_from_hf(hf: Mapping[str, Any], *, dtype: str = "float32") -> ModelConfig:
    """`ModelConfig` from a HF ``config.json`` dict.

    ``dtype`` ("float32" or "bfloat16") sets both parameter and compute dtype.
    Raises ValueError on an unsupported ``model_type``, RoPE scaling, or a
    Qwen3-MoE layout with dense layers (``mlp_only_layers``,
    ``decoder_sparse_step != 1``).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    model_type = hf.get("model_type")
    if model_type not in _MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} not supported; expected one of "
                         f"{sorted(_MODEL_TYPES)}")
    arch = _MODEL_TYPES[model_type]
    heads = int(hf["num_attention_heads"])
    kw: dict[str, Any] = dict(
        arch=arch, vocab_size=int(hf["vocab_size"]), hidden_size=int(hf["hidden_size"]),
        num_layers=int(hf["num_hidden_layers"]), num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
        intermediate_size=int(hf["intermediate_size"]), rope_theta=_rope_theta(hf),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)), qk_norm=arch != "llama",
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        param_dtype=dtype, dtype=dtype)
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf['hidden_act']!r} not supported (SwiGLU/silu only)")
    if hf.get("mlp_bias") or hf.get("attention_bias"):
        # HF puts the bias on o_proj too; our attention has q/k/v biases only.
        raise ValueError("attention_bias / mlp_bias = True is not supported")
    if arch == "qwen3_moe":
        if hf.get("mlp_only_layers") or int(hf.get("decoder_sparse_step", 1)) != 1:
            raise ValueError("Qwen3-MoE with dense layers (mlp_only_layers / "
                             "decoder_sparse_step) is not supported")
        # transformers >= 5 writes ``num_local_experts``; Hub checkpoints ``num_experts``.
        kw.update(num_experts=int(hf.get("num_experts") or hf["num_local_experts"]),
                  num_experts_per_tok=int(hf["num_experts_per_tok"]),
                  moe_intermediate_size=int(hf["moe_intermediate_size"]),
                  norm_topk_prob=bool(hf.get("norm_topk_prob", True)))
    return ModelConfig(**kw)


def config_to_hf(cfg: ModelConfig, *, bos_token_id: int | None = None,
                 eos_token_id: int | None = None, pad_token_id: int | None = None) -> dict:
    """HF ``config.json`` dict for ``cfg``.

    Raises ValueError for what the HF class cannot express (a shared expert
    in Qwen3-MoE, qk-norm in Llama, no qk-norm in Qwen3).
    """
    architecture, model_type = _ARCH_NAMES[cfg.arch]
    if cfg.qk_norm != (cfg.arch != "llama"):
        raise ValueError(f"{architecture} {'has' if cfg.arch != 'llama' else 'has no'} "
                         f"qk-norm, but cfg.qk_norm={cfg.qk_norm}")
    if cfg.attention_bias:
        raise ValueError(f"{architecture} with attention_bias also biases o_proj; "
                         "cfg.attention_bias=True cannot be exported")
    if cfg.shared_expert_intermediate_size:
        raise ValueError("Qwen3MoeForCausalLM has no shared expert "
                         "(shared_expert_intermediate_size must be 0 to export)")
    torch_dtype = cfg.param_dtype
    hf: dict[str, Any] = {
        "architectures": [architecture], "model_type": model_type,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": cfg.tie_word_embeddings, "use_cache": True,
        "initializer_range": 0.02, "torch_dtype": torch_dtype,
        "bos_token_id": bos_token_id, "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
    }
    if cfg.arch == "llama":
        hf.update(mlp_bias=False, pretraining_tp=1)
    else:
        hf.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.num_layers)
    if cfg.is_moe:
        hf.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                  moe_intermediate_size=cfg.moe_intermediate_size,
                  norm_topk_prob=cfg.norm_topk_prob, decoder_sparse_step=1,
                  mlp_only_layers=[], output_router_logits=False,
                  router_aux_loss_coef=0.001)
    return hf


# ----------------------------------------------------------------------------- weights


def _layer_map(cfg: ModelConfig, i: int) -> Iterator[tuple[str, tuple, Any, Any]]:
    """(HF name, our path, to_ours(w), to_hf(k)) for layer ``i``."""
    d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    hf, us = f"model.layers.{i}.", ("layers", i)
    t = lambda w: w.T  # noqa: E731  [out, in] <-> [in, out]
    yield hf + "input_layernorm.weight", us + ("input_norm", "scale"), None, None
    yield hf + "post_attention_layernorm.weight", us + ("post_attn_norm", "scale"), None, None
    for name, n in (("q_proj", h), ("k_proj", kv), ("v_proj", kv)):
        yield (hf + f"self_attn.{name}.weight", us + ("attn", name, "kernel"),
               lambda w, n=n: w.T.reshape(d, n, hd), lambda k: k.reshape(d, -1).T)
    yield (hf + "self_attn.o_proj.weight", us + ("attn", "o_proj", "kernel"),
           lambda w: w.T.reshape(h, hd, d), lambda k: k.reshape(h * hd, d).T)
    if cfg.qk_norm:
        yield hf + "self_attn.q_norm.weight", us + ("attn", "q_norm", "scale"), None, None
        yield hf + "self_attn.k_norm.weight", us + ("attn", "k_norm", "scale"), None, None
    if not cfg.is_moe:
        for name in ("gate_proj", "up_proj", "down_proj"):
            yield hf + f"mlp.{name}.weight", us + ("mlp", name, "kernel"), t, t
        return
    yield hf + "mlp.gate.weight", us + ("moe", "router", "kernel"), t, t
    for e in range(cfg.num_experts):
        for name, ours in (("gate_proj", "experts_gate"), ("up_proj", "experts_up"),
                           ("down_proj", "experts_down")):
            # Our tensor is stacked [E, ...]: one HF tensor fills slot e.
            yield (hf + f"mlp.experts.{e}.{name}.weight", us + ("moe", ours, e), t, t)


def weight_map(cfg: ModelConfig) -> list[tuple[str, tuple, Any, Any]]:
    """Every (HF name, our param path, to_ours, to_hf) of a `Transformer`.

    Expert paths end with the expert index ``e`` (a slot of the stacked
    ``[E, ...]`` parameter). ``to_* = None`` means identity.
    """
    out = [("model.embed_tokens.weight", ("embed", "embedding"), None, None),
           ("model.norm.weight", ("final_norm", "scale"), None, None)]
    for i in range(cfg.num_layers):
        out.extend(_layer_map(cfg, i))
    if not cfg.tie_word_embeddings:
        out.append(("lm_head.weight", ("lm_head", "kernel"), lambda w: w.T, lambda k: k.T))
    return out


def params_from_hf(cfg: ModelConfig, state: Mapping[str, np.ndarray]) -> dict[tuple, np.ndarray]:
    """HF tensors -> ``{our param path: array}`` (numpy, dtype unchanged).

    Raises ValueError naming missing or unexpected tensors. A ``lm_head.weight``
    next to tied embeddings must equal the embedding (checked) and is dropped;
    ``rotary_emb.inv_freq`` buffers are ignored.
    """
    # Older Llama checkpoints carry the RoPE buffer; it is recomputed, not loaded.
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    if cfg.tie_word_embeddings and "lm_head.weight" in state:
        head = state.pop("lm_head.weight")
        if not np.array_equal(np.asarray(head), np.asarray(state.get("model.embed_tokens.weight"))):
            raise ValueError("tie_word_embeddings=True but lm_head.weight differs from "
                             "model.embed_tokens.weight")
    entries = weight_map(cfg)
    missing = [name for name, *_ in entries if name not in state]
    unexpected = sorted(set(state) - {name for name, *_ in entries})
    if missing or unexpected:
        raise ValueError(f"HF weights do not match the config: missing {missing[:8]}"
                         f"{'...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}")
    params: dict[tuple, Any] = {}
    experts: dict[tuple, dict[int, np.ndarray]] = {}
    for name, path, to_ours, _ in entries:
        w = np.asarray(state[name])
        try:
            w = to_ours(w) if to_ours else w
        except ValueError as e:  # a reshape that does not fit the config
            raise ValueError(f"{name}: shape {w.shape} does not fit the config ({e})") from e
        if isinstance(path[-1], int):
            experts.setdefault(path[:-1], {})[path[-1]] = w
        else:
            params[path] = w
    for path, per_expert in experts.items():
        params[path] = np.stack([per_expert[e] for e in range(len(per_expert))])
    return params


def params_to_hf(cfg: ModelConfig, params: Mapping[tuple, np.ndarray]) -> dict[str, np.ndarray]:
    """``{our param path: array}`` -> HF tensors (contiguous numpy)."""
    out = {}
    for name, path, _, to_hf in weight_map(cfg):
        if isinstance(path[-1], int):
            w = np.asarray(params[path[:-1]])[path[-1]]
        else:
            w = np.asarray(params[path])
        out[name] = np.ascontiguousarray(to_hf(w) if to_hf else w)
    return out


def model_params(model) -> dict[tuple, np.ndarray]:
    """``{path: numpy array}`` of every ``nnx.Param`` of ``model`` (gathered to host)."""
    return {tuple(path): np.asarray(var.get_value())
            for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def param_shapes(cfg: ModelConfig) -> dict[tuple, tuple[int, ...]]:
    """``{param path: shape}`` of `Transformer(cfg)`, without allocating it."""
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    return {tuple(path): tuple(var.get_value().shape)
            for path, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param))}


def random_params(cfg: ModelConfig, seed: int = 0, scale: float = 0.1) -> dict[tuple, np.ndarray]:
    """Gaussian float32 values for every parameter (norm scales ``1 + noise``).

    For tests and benchmarks: unlike the model's own init, no tensor is all
    ones or zeros, so a mis-mapped weight cannot go unnoticed; and it needs no
    per-shape compilation.
    """
    rng = np.random.default_rng(seed)
    return {path: (rng.normal(0.0, scale, shape) + (path[-1] == "scale")).astype(np.float32)
            for path, shape in param_shapes(cfg).items()}


def build_model(cfg: ModelConfig, params: Mapping[tuple, np.ndarray], *, mesh=None):
    """A `Transformer` holding ``params`` (cast to ``cfg.param_dtype``).

    With ``mesh``, each parameter is created straight on the mesh with the
    sharding its logical axes name (`sao.models.sharding.state_shardings`):
    every device receives only its own slice of the host array
    (``jax.make_array_from_callback``), no device ever holds a whole tensor it
    does not keep, and in a multi-process job each process places only its
    devices' slices. Without ``mesh`` the arrays go to the default device.

    Raises ValueError on a missing path or a shape mismatch.
    """
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    shardings = dict(nnx.to_flat_state(state_shardings(state, mesh))) if mesh is not None else {}
    flat = nnx.to_flat_state(state)
    dtype = cfg.jnp_param_dtype
    for path, var in flat:
        path = tuple(path)
        if path not in params:
            raise ValueError(f"no weights for parameter {'/'.join(map(str, path))}")
        want = var.get_value().shape
        got = np.shape(params[path])
        if tuple(got) != tuple(want):
            raise ValueError(f"{'/'.join(map(str, path))}: shape {got} != expected {want}")
        if mesh is None:
            var.set_value(jnp.asarray(params[path], dtype=dtype))
            continue
        host = np.asarray(params[path]).astype(dtype, copy=False)
        var.set_value(jax.make_array_from_callback(
            host.shape, shardings[path].get_value(), lambda index, host=host: host[index]))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


# ----------------------------------------------------------------------------- files

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"


def load_hf_state(model_dir: str) -> dict[str, np.ndarray]:
    """All tensors of ``model.safetensors`` or of the shards listed in
    ``model.safetensors.index.json`` (numpy; bfloat16 as ``ml_dtypes``).

    Raises FileNotFoundError if neither file exists.
    """
    single = os.path.join(model_dir, SAFETENSORS)
    index = os.path.join(model_dir, SAFETENSORS_INDEX)
    if os.path.exists(single):
        files = [single]
    elif os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            files = [os.path.join(model_dir, s) for s in sorted(set(json.load(f)["weight_map"].values()))]
    else:
        raise FileNotFoundError(f"neither {SAFETENSORS} nor {SAFETENSORS_INDEX} in {model_dir}")
    state = {}
    for path in files:
        with safe_open(path, framework="np") as f:  # host arrays (bfloat16 as ml_dtypes)
            for name in f.keys():
                state[name] = np.asarray(f.get_tensor(name))
    return state


def save_hf_state(state: Mapping[str, np.ndarray], model_dir: str, *,
                  max_shard_bytes: int = 4 * 2 ** 30) -> list[str]:
    """Writes tensors as ``model.safetensors``, or as
    ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``
    when they exceed ``max_shard_bytes``. Returns the file names written."""
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, w in state.items():
        if shards[-1] and size + w.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = w
        size += w.nbytes
    meta = {"format": "pt"}
    if len(shards) == 1:
        names = [SAFETENSORS]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards):
        save_file({k: np.ascontiguousarray(v) for k, v in shard.items()},
                  os.path.join(model_dir, name), metadata=meta)
    if len(shards) > 1:
        index = {"metadata": {"total_size": int(sum(w.nbytes for w in state.values()))},
                 "weight_map": {k: n for n, s in zip(names, shards) for k in s}}
        with open(os.path.join(model_dir, SAFETENSORS_INDEX), "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2)
    return names


def load_hf_model(path: str, *, dtype: str = "float32", mesh=None):
    """Loads ``(cfg, model, tokenizer)`` from a HF directory.

    Args:
      path: directory with ``config.json`` and ``model.safetensors`` (or a
        sharded index) for Qwen3 / Qwen3-MoE / Llama.
      dtype: "float32" or "bfloat16", parameter and compute dtype.
      mesh: optional ``jax.sharding.Mesh``; parameters are placed by the
        sharding rules.
    Returns:
      ``(ModelConfig, Transformer, tokenizer)``; the tokenizer is None when
      the directory has no ``tokenizer.json``.
    Raises:
      FileNotFoundError: missing files; ValueError: unsupported architecture
      or weights that do not match the config.
    """
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"no config.json in {path}")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = config_from_hf(json.load(f), dtype=dtype)
    state = load_hf_state(path)
    tokenizer = (load_hf_tokenizer(path, vocab_size=cfg.vocab_size)
                 if os.path.exists(os.path.join(path, "tokenizer.json")) else None)
    model = build_model(cfg, params_from_hf(cfg, state), mesh=mesh)
    return cfg, model, tokenizer


def save_pretrained(model, cfg: ModelConfig, path: str, tokenizer=None, *,
                    max_shard_bytes: int = 4 * 2 ** 30) -> None:
    """Writes ``model`` in HF format to directory ``path`` (created).

    Files: ``config.json`` (``architectures`` / ``model_type`` of
    Qwen3ForCausalLM, Qwen3MoeForCausalLM or LlamaForCausalLM), safetensors in
    the parameters' dtype, and with a tokenizer ``tokenizer.json`` +
    ``tokenizer_config.json`` (the byte-level tokenizer is written as an
    equivalent ``tokenizers`` BPE). Loadable by ``transformers`` and SGLang.
    Raises ValueError if ``cfg`` cannot be expressed in HF format.
    """
    ids = {}
    if tokenizer is not None:
        ids = dict(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id,
                   pad_token_id=tokenizer.pad_id)
    hf_cfg = config_to_hf(cfg, **ids)
    os.makedirs(path, exist_ok=True)
    save_hf_state(params_to_hf(cfg, model_params(model)), path, max_shard_bytes=max_shard_bytes)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_cfg, f, indent=2)
    if tokenizer is not None:
        save_hf_tokenizer(tokenizer, path)
