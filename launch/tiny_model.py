"""A small Qwen3 that calls the Python tool in Hermes format: a model directory built offline.

    python launch/tiny_model.py runs/tiny_qwen3     # ~1-2 min on 2 CPU cores; cached

What the SGLang fleet commands on a CPU (README, docs/multihost.md, the
launchers' tests) take as ``--model``: an HF directory (config, safetensors,
tokenizer) that both SGLang servers load, built here without a download.

Both SGLang servers need ``head_dim`` 128; everything else is as small as it
goes (2 layers, width 64, a ~600-token vocabulary), so a server starts in
seconds and a learner step is quick on 2 CPU cores. The tokenizer is a
byte-level BPE with Qwen3's pre-tokenizer split, ChatML specials and the
Hermes tool tokens, trained on the episodes it will see. A short SFT on
demonstrations (the environment's own ChatML prompt, then a ``<tool_call>``
running ``print(<expression>)``, the ``<tool_response>`` framed as the agent
loop frames it, then ``<answer>...</answer>``) makes it call the tool, so the
runs exercise Hermes tool calls through the sandbox. ``write_model`` saves it
with SAO's HF exporter (``sao.models.save_pretrained``): config, safetensors,
tokenizer files.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
if __name__ == "__main__":
    from launch import venv_check
    venv_check.ensure()

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from experiments import sao_math  # noqa: E402
from sao import components, sft  # noqa: E402
from sao.data.demonstrations import SFTArrays  # noqa: E402
from sao.models import Transformer, get_preset, save_pretrained  # noqa: E402
from sao.models.tokenizer import HFTokenizer  # noqa: E402
from sao.rollout.agent import chatml_tool_format  # noqa: E402

CONFIG = "experiments/sao_math.py:fleet_cpu"
# Qwen2/Qwen3's pre-tokenisation split (public tokenizer.json of the family).
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")


def episodes(n: int, seed: int = 0) -> list[tuple[str, list[tuple[str, bool]]]]:
    """``n`` demonstrations ``(prompt text, [(text, is_action), ...])`` on the
    config's own prompts: a tool call computing the answer, its framed
    output, the answer."""
    cfg = sao_math.get_config("fleet_cpu")
    tasks = components.make_tasks(cfg)
    env = components.make_env_factory(cfg, tasks)()
    records = [r for t in tasks.values() for r in t.records()]
    rng = np.random.default_rng(seed)
    out = []
    for i in rng.choice(len(records), size=n, replace=False):
        record = records[int(i)]
        expression = record["entry"]["metadata"]["expression"]
        value = str(eval(expression, {"__builtins__": {}}, {}))  # + - * of integers
        call = json.dumps({"name": "python", "arguments": {"code": f"print({expression})"}})
        spans = [(f"<tool_call>\n{call}\n</tool_call><|im_end|>", True),
                 (f"\n<|im_start|>user\n<tool_response>\n{value}\n</tool_response><|im_end|>\n"
                  f"<|im_start|>assistant\n", False),
                 (f"<answer>{value}</answer><|im_end|>", True)]
        out.append((env.reset(record), spans))
    return out


def tokenizer(corpus: list[str], vocab_size: int = 600) -> HFTokenizer:
    """Byte-level BPE with Qwen3's split, ChatML specials and the Hermes tool tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return HFTokenizer(tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                       stop_tokens=("<|im_end|>", "<|endoftext|>"))


def model_config(vocab_size: int):
    """Qwen3 layout, head_dim 128 (both servers need it), otherwise tiny."""
    return dataclasses.replace(get_preset("tiny"), vocab_size=vocab_size, hidden_size=64,
                               num_layers=2, num_heads=2, num_kv_heads=1, head_dim=128,
                               intermediate_size=128, tie_word_embeddings=False,
                               max_position_embeddings=1024)


def sft_arrays(demos, tok, max_len: int) -> SFTArrays:
    """Prompt and framed tool output are context (no loss), the rest actions."""
    fmt = chatml_tool_format(tok)
    rows, masks = [], []
    for prompt, spans in demos:
        ids, mask = tok.encode(prompt), []
        mask = [False] * len(ids)
        for text, is_action in spans:
            piece = tok.encode(text)
            ids += piece
            mask += [is_action] * len(piece)
        rows.append(ids)
        masks.append(mask)
    assert fmt.observation_prefix.startswith("\n<|im_start|>user")  # the frame the demos use
    n = len(rows)
    tokens = np.full((n, max_len), tok.pad_id, np.int32)
    loss_mask = np.zeros((n, max_len), bool)
    lengths = np.array([len(r) for r in rows], np.int32)
    if lengths.max() > max_len:
        raise ValueError(f"a demonstration has {lengths.max()} tokens > {max_len}")
    for i, (r, m) in enumerate(zip(rows, masks)):
        tokens[i, :len(r)], loss_mask[i, :len(m)] = r, m
    return SFTArrays(tokens, loss_mask, lengths, np.ones(n, bool))


def write_model(path: str, *, sft_steps: int = 300, seed: int = 0) -> dict:
    """Writes the tool-calling tiny Qwen3 to ``path`` (HF dir); returns facts about it."""
    demos = episodes(512, seed=seed)
    corpus = [p + "".join(t for t, _ in spans) for p, spans in demos]
    tok = tokenizer(corpus)
    cfg = model_config(tok.vocab_size)
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    data = sft_arrays(demos, tok, max_len=384)
    result = sft.train_sft(model, data, steps=sft_steps, batch_size=16, lr=3e-3,
                           warmup_steps=20, seed=seed, pad_multiple=64)
    save_pretrained(nnx.state(model, nnx.Param), cfg, path, tok)
    return {"sft_loss": result["sft/loss"], "vocab_size": tok.vocab_size,
            "max_demo_tokens": int(data.lengths.max())}


def cached(cache_dir: str | None = None) -> str:
    """The model's directory under ``~/.cache/sao/tiny_qwen3/<hash>`` (``$SAO_CACHE_DIR``),
    built once per version of this file: the hash is of its source."""
    with open(os.path.abspath(__file__), "rb") as f:
        key = hashlib.sha256(f.read()).hexdigest()[:16]
    base = cache_dir or os.environ.get("SAO_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "sao")
    path = os.path.join(base, "tiny_qwen3", key)
    if not os.path.exists(os.path.join(path, "config.json")):
        with tempfile.TemporaryDirectory(dir=os.path.dirname(path) if os.path.isdir(os.path.dirname(path))
                                         else None) as tmp:
            write_model(os.path.join(tmp, "hf"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                os.rename(os.path.join(tmp, "hf"), path)
            except OSError:  # another process built it first
                if not os.path.exists(os.path.join(path, "config.json")):
                    raise
    return path


def main(argv: list[str]) -> int:
    """``tiny_model.py OUT_DIR``: OUT_DIR becomes a copy of the cached model (built if needed)."""
    if len(argv) != 1:
        print(f"usage: python {sys.argv[0]} OUT_DIR", file=sys.stderr)
        return 2
    if os.path.exists(argv[0]):
        print(f"{argv[0]} exists; leaving it", file=sys.stderr)
        return 1
    print("tiny_model: the cached model, built first if this machine has none (training a small "
          "Qwen3 on CPU: minutes, no output until done)", file=sys.stderr, flush=True)
    source = cached()
    shutil.copytree(source, argv[0])
    print(os.path.abspath(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
