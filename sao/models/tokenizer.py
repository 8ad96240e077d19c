"""Tokenizers: a common protocol, the byte-level tokenizer of tiny models, and
a wrapper around Hugging Face ``tokenizers`` (``tokenizer.json`` or a
vocabulary rebuilt from a GGUF file).

Token-in/token-out: the rollout engine keeps the ids it sampled; text is only
decoded for the environment and encoded for observations, never re-tokenised
for training (docs/algorithm.md §2).

Byte-level layout (docs/architecture.md): ids 0..255 are raw bytes, then the
special tokens ``<pad>``=256, ``<bos>``=257, ``<eos>``=258, ``<python>``=259,
``</python>``=260, ``<output>``=261, ``</output>``=262, ``<answer>``=263,
``</answer>``=264; ids 265..271 are unused padding up to a vocabulary of 272.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping, Protocol, Sequence, runtime_checkable

BYTE_SPECIAL_TOKENS: tuple[str, ...] = (
    "<pad>", "<bos>", "<eos>", "<python>", "</python>",
    "<output>", "</output>", "<answer>", "</answer>",
)
BYTE_VOCAB_SIZE = 272


@runtime_checkable
class Tokenizer(Protocol):
    """What every part of SAO may assume of a tokenizer.

    Attributes:
      vocab_size: number of rows of the model's embedding the ids index
        (may exceed the number of real tokens: padding rows).
      pad_id, bos_id, eos_id: ids of the padding, beginning- and
        end-of-sequence tokens.
      special_ids: ``{token string: id}`` of every special token.
      stop_ids: ids that end a generation (end of sequence / end of turn).
    """

    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int

    @property
    def special_ids(self) -> Mapping[str, int]: ...

    @property
    def stop_ids(self) -> tuple[int, ...]: ...

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Text to ids; literal special-token strings become their ids."""

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Ids to text; invalid byte sequences become U+FFFD."""


def _special_pattern(specials: Iterable[str]) -> re.Pattern[str]:
    # Longest first so that no special token matches a prefix of another.
    alternatives = sorted(specials, key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(s) for s in alternatives) + ")")


class ByteTokenizer:
    """Byte-level tokenizer of the ``tiny`` preset (vocab 272).

    ``encode`` maps UTF-8 bytes to ids 0..255 and each literal special-token
    string (e.g. ``"<python>"``) to its single id, so tool tags are one token
    and stop conditions are token ids. ``decode`` concatenates bytes and
    decodes UTF-8 with replacement (``errors="replace"``); special ids decode
    to their strings unless ``skip_special``; unused ids 265..271 decode to
    ``""``. Round trip: ``decode(encode(s)) == s`` for every ``str`` ``s``.
    """

    vocab_size = BYTE_VOCAB_SIZE
    pad_id = 256
    bos_id = 257
    eos_id = 258

    def __init__(self):
        self._special_ids = {s: 256 + i for i, s in enumerate(BYTE_SPECIAL_TOKENS)}
        self._id_to_special = {i: s for s, i in self._special_ids.items()}
        self._pattern = _special_pattern(self._special_ids)

    @property
    def special_ids(self) -> dict[str, int]:
        return dict(self._special_ids)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return (self.eos_id,)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Encodes ``text``; raises TypeError if it is not a ``str``."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        ids = [self.bos_id] if add_bos else []
        for i, piece in enumerate(self._pattern.split(text)):
            if i % 2:  # odd pieces are the captured special tokens
                ids.append(self._special_ids[piece])
            elif piece:
                ids.extend(piece.encode("utf-8"))
        return ids

    def to_tokenizers(self):
        """The same tokenizer as a ``tokenizers.Tokenizer`` (byte-level BPE
        without merges, specials as added tokens 256..264), so that HF tools
        (transformers, SGLang) can load a tiny model's ``tokenizer.json``."""
        from gguf import bytes_to_unicode  # GPT-2's byte -> printable character table
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        byte_char = bytes_to_unicode()
        tok = Tokenizer(models.BPE(vocab={byte_char[b]: b for b in range(256)}, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                                for s in BYTE_SPECIAL_TOKENS])
        return tok

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Decodes ids; raises ValueError on an id outside [0, 272)."""
        out: list[str] = []
        buf = bytearray()
        for raw in ids:
            i = int(raw)
            if 0 <= i < 256:
                buf.append(i)
                continue
            if not 256 <= i < self.vocab_size:
                raise ValueError(f"token id {i} outside [0, {self.vocab_size})")
            if buf:
                out.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
            special = self._id_to_special.get(i)
            if special is not None and not skip_special:
                out.append(special)
        if buf:
            out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` behind the SAO protocol.

    Args:
      tokenizer: a ``tokenizers.Tokenizer`` (from ``tokenizer.json`` or
        :func:`sao.models.gguf_io.tokenizer_from_gguf`).
      vocab_size: rows of the model's embedding (>= the tokenizer's size).
      bos_token, eos_token, pad_token: token strings; ``pad`` defaults to
        ``eos`` and ``bos`` to ``eos`` when the model has none.
      stop_tokens: extra end-of-turn tokens (e.g. ``"<|im_end|>"``) that stop
        generation besides ``eos``.
      chat_template: the model's Jinja chat template, kept for export.
    Raises ValueError if a named token is not in the vocabulary.
    """

    def __init__(self, tokenizer, *, vocab_size: int | None = None,
                 bos_token: str | None = None, eos_token: str,
                 pad_token: str | None = None,
                 stop_tokens: Sequence[str] = (), chat_template: str | None = None):
        self.tok = tokenizer
        self.chat_template = chat_template
        n = tokenizer.get_vocab_size(with_added_tokens=True)
        self.vocab_size = int(vocab_size) if vocab_size is not None else n
        if self.vocab_size < n:
            raise ValueError(f"vocab_size {self.vocab_size} < tokenizer size {n}")
        self.eos_id = self._id(eos_token)
        self.bos_id = self._id(bos_token) if bos_token else self.eos_id
        self.pad_id = self._id(pad_token) if pad_token else self.eos_id
        self.bos_token, self.eos_token = bos_token, eos_token
        self.pad_token = pad_token or eos_token
        self._stop = tuple(dict.fromkeys(
            [self.eos_id] + [self._id(t) for t in stop_tokens]))
        self._special_ids = {
            t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()
            if t.special}

    def _id(self, token: str) -> int:
        i = self.tok.token_to_id(token)
        if i is None:
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return int(i)

    @property
    def special_ids(self) -> dict[str, int]:
        return dict(self._special_ids)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return self._stop

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Encodes ``text`` without template tokens; special strings map to ids."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        ids = self.tok.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if add_bos else []) + list(ids)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Decodes ids; raises ValueError on an id outside [0, vocab_size)."""
        ids = [int(i) for i in ids]
        n = self.tok.get_vocab_size(with_added_tokens=True)
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} outside [0, {self.vocab_size})")
        # Embedding padding rows (>= tokenizer size) have no text.
        ids = [i for i in ids if i < n]
        return self.tok.decode(ids, skip_special_tokens=skip_special)

    def save(self, path: str) -> None:
        """Writes ``tokenizer.json`` to ``path``."""
        self.tok.save(path)


def load_hf_tokenizer(model_dir: str, *, vocab_size: int | None = None) -> HFTokenizer:
    """Loads ``tokenizer.json`` (+ ``tokenizer_config.json`` if present).

    Special tokens come from ``tokenizer_config.json`` (``bos_token``,
    ``eos_token``, ``pad_token``); without it ``<|endoftext|>`` /
    ``<|im_end|>`` / ``</s>`` are tried. ``<|im_end|>`` is a stop token when
    present (ChatML). Raises FileNotFoundError if there is no tokenizer.json.
    """
    import json
    import os

    from tokenizers import Tokenizer as _Tok

    tok_path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(tok_path):
        raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
    tok = _Tok.from_file(tok_path)
    cfg: dict = {}
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)

    def name(key):
        v = cfg.get(key)
        if isinstance(v, dict):  # AddedToken serialised as a dict
            v = v.get("content")
        return v if v and tok.token_to_id(v) is not None else None

    eos = name("eos_token")
    if eos is None:
        eos = next((t for t in ("<|endoftext|>", "<|im_end|>", "</s>", "<eos>")
                    if tok.token_to_id(t) is not None), None)
    if eos is None:
        raise ValueError(f"cannot tell the eos token of {tok_path}")
    stops = [t for t in ("<|im_end|>", "<|endoftext|>") if tok.token_to_id(t) is not None]
    return HFTokenizer(tok, vocab_size=vocab_size, bos_token=name("bos_token"),
                       eos_token=eos, pad_token=name("pad_token"), stop_tokens=stops,
                       chat_template=cfg.get("chat_template"))


def save_hf_tokenizer(tokenizer: Tokenizer, model_dir: str) -> None:
    """Writes ``tokenizer.json`` and ``tokenizer_config.json`` to ``model_dir``.

    Accepts a `ByteTokenizer` (converted by ``to_tokenizers``) or an
    `HFTokenizer`; raises TypeError for anything else.
    """
    import json
    import os

    if isinstance(tokenizer, ByteTokenizer):
        tok, template = tokenizer.to_tokenizers(), None
        names = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
    elif isinstance(tokenizer, HFTokenizer):
        tok, template = tokenizer.tok, tokenizer.chat_template
        names = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token,
                 "pad_token": tokenizer.pad_token}
    else:
        raise TypeError(f"cannot export a {type(tokenizer).__name__} as tokenizer.json")
    tok.save(os.path.join(model_dir, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              **{k: v for k, v in names.items() if v is not None}}
    if template:
        config["chat_template"] = template
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
