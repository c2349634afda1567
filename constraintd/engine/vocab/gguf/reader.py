# A GGUF file's vocabulary, decoded the way llama.cpp's `llama_vocab::impl::load` decodes it.
#
# Contract: for a file llama.cpp loads, `read_gguf_vocab` gives
# - every token's piece byte for byte as `llama_token_to_piece(vocab, t, buf, n, lstrip=0, special=true)`;
# - the end-of-generation set of `llama_vocab_is_eog`;
# - the token texts and attributes (`llama_token_attr`) as llama.cpp ends up with them, which is what
#   its tokenizer uses to find special tokens in text.
# The steps, in llama.cpp's order (each changes attributes the next ones and the pieces depend on):
#   1. attributes from `tokenizer.ggml.token_type`;
#   2. special token ids: the tokenizer model's defaults, then the file's `*_token_id` keys;
#   3. EOT / EOM / FIM tokens found by their text when the file does not name them (made CONTROL);
#   4. control tokens whose text contains "unused" become UNUSED too;
#   5. the end-of-generation set: FIM pad/rep/sep, tokens with a known end-of-turn text (made CONTROL),
#      then eos / eot / eom; gpt-oss's channel tokens become USER_DEFINED; the o200k_harmony / solar-open
#      and Gemma 4 / PLaMo exceptions take `<|end|>` / `</s>` out again;
#   6. pieces, from the attributes as they are now;
#   7. LSTRIP / RSTRIP for the models llama.cpp names (these do not change pieces).
# Where llama.cpp's result depends on the iteration order of its std::unordered_map (several texts
# claiming the same EOT / FIM slot), the lowest token id wins here. Pre-tokenizer names are not checked
# (llama.cpp refuses unknown ones; pieces do not depend on them except through `escape_whitespaces`).
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from constraintd.engine.vocab.gguf.metadata import GgufType, GgufValue, read_gguf_metadata
from constraintd.engine.vocab.gguf.pieces import PIECE_DECODERS
from constraintd.engine.vocab.token_lookup import TokenAttr, TokenizerRules
from constraintd.errors import VocabError

__all__ = ["GgufVocabContent", "read_gguf_vocab"]

A = TokenAttr
KEY = "tokenizer.ggml."


@dataclass(frozen=True, slots=True)
class GgufVocabContent:
    """What a GGUF file says about its vocabulary, decoded as llama.cpp decodes it."""

    pieces: Sequence[bytes]
    eog_ids: frozenset[int]
    token_texts: Sequence[str]
    token_attrs: Sequence[int]
    tokenizer: TokenizerRules


# `tokenizer.ggml.token_type` values (llama_token_type) -> attributes.
_ATTR_OF_TYPE: dict[int, TokenAttr] = {
    0: A.UNDEFINED,
    1: A.NORMAL,
    2: A.UNKNOWN,
    3: A.CONTROL,
    4: A.USER_DEFINED,
    5: A.UNUSED,
    6: A.BYTE,
}

# Per tokenizer model: llama.cpp's default special ids (bos, eos, unk, sep, pad, mask; -1 = none),
# whether it spells spaces with a prefix by default, and the BPE merges it requires.
_NONE = -1


@dataclass(frozen=True, slots=True)
class _Model:
    defaults: Mapping[str, int]
    add_space_prefix: bool = False
    needs_merges: bool = False


_SPECIAL_KEYS = ("bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask",
                 "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep",
                 "prefix", "suffix", "middle")  # fmt: skip
# The deprecated keys fill the same slots as the fim_* ones.
_SLOT_OF_KEY = {"prefix": "fim_pre", "suffix": "fim_suf", "middle": "fim_mid"}

_MODELS: dict[str, _Model] = {
    "llama": _Model({"bos": 1, "eos": 2, "unknown": 0}, add_space_prefix=True),
    "bert": _Model({"bos": 101, "unknown": 100, "seperator": 102, "padding": 0, "mask": 103}),
    "gpt2": _Model({"bos": 11, "eos": 11}, needs_merges=True),
    "hybriddna": _Model({"bos": 11, "eos": 11}, needs_merges=True),
    "whitespace": _Model({"bos": 11, "eos": 11}, needs_merges=True),
    "t5": _Model({"eos": 1, "unknown": 2, "padding": 0}),
    "rwkv": _Model({}),
    "test": _Model({}),
    "plamo2": _Model({"bos": 1, "eos": 2, "unknown": 0, "padding": 3}),
    "gemma4": _Model({}, needs_merges=True),
}

# Texts that name a special slot when the file does not (first found wins; step 3).
_SLOT_TEXTS: dict[str, tuple[str, ...]] = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
            "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}  # fmt: skip

# Texts that end generation (step 5).
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
))  # fmt: skip

_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss

# BPE pre-tokenizers whose vocabularies spell spaces as U+2581 (`escape_whitespaces`).
_ESCAPING_PRE = frozenset(("gemma4", "granite-embed-multi-311m", "sarvam-moe"))

_DNA_KMER_MARKER = b"\xee\x80\x80"


class _Metadata:
    """Typed access to the keys llama.cpp's vocabulary loader reads, with its type checks."""

    def __init__(self, name: str, values: Mapping[str, GgufValue]) -> None:
        self.name = name
        self.values = values

    def get(self, key: str, kind: GgufType) -> object | None:
        found = self.values.get(key)
        if found is None:
            return None
        if found.type is not kind:
            raise VocabError(f"{self.name}: key {key} has type {found.type.name}, expected {kind.name}")
        return found.value

    def text(self, key: str) -> str | None:
        value = self.get(key, GgufType.STRING)
        return None if value is None else bytes(value).decode("utf-8", "surrogateescape")  # type: ignore[call-overload]

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, GgufType.BOOL)
        return default if value is None else bool(value)

    def array(self, key: str, items: tuple[GgufType, ...], n_tokens: int) -> GgufValue | None:
        found = self.values.get(key)
        if found is None:
            return None
        if found.type is not GgufType.ARRAY or found.item_type not in items:
            raise VocabError(f"{self.name}: invalid GGUF type for {key}")
        if n_tokens and found.count < n_tokens:
            raise VocabError(f"{self.name}: {key} has {found.count} entries for {n_tokens} tokens")
        return found


def read_gguf_vocab(path: str | os.PathLike[str]) -> GgufVocabContent:
    """Read the vocabulary of a GGUF file as llama.cpp loads it.

    Raises:
        VocabError: the file is missing or unreadable, not a GGUF, holds no tokenizer (or an empty one),
            uses a tokenizer model llama.cpp does not know, or is malformed where llama.cpp checks it.
    """
    name = os.fspath(path)
    meta = _Metadata(name, read_gguf_metadata(path, string_arrays=(KEY + "tokens",)))
    model_name = meta.text(KEY + "model")
    if model_name is None:
        raise VocabError(f"{name} holds no tokenizer (no tokenizer.ggml.model key)")
    if model_name in ("no_vocab", "none"):
        raise VocabError(f"{name} holds no vocabulary (tokenizer model {model_name!r})")
    model = _MODELS.get(model_name)
    if model is None:
        raise VocabError(f"{name}: unknown tokenizer model {model_name!r}")
    pre = "gemma4" if model_name == "gemma4" else meta.text(KEY + "pre") or ""
    needs_merges = model.needs_merges and pre != "kimi-k2"
    if needs_merges and meta.array(KEY + "merges", (GgufType.STRING,), 0) is None:
        raise VocabError(f"{name}: cannot find tokenizer merges")
    if model_name == "t5":
        _check_charsmap(meta)
    rules = TokenizerRules(
        model_name,
        add_space_prefix=meta.flag(KEY + "add_space_prefix", model.add_space_prefix),
        escape_whitespaces=model.needs_merges and pre in _ESCAPING_PRE,
    )
    meta.flag(KEY + "remove_extra_whitespaces", False)  # type-checked as llama.cpp does

    tokens = meta.array(KEY + "tokens", (GgufType.STRING,), 0)
    if tokens is None:
        raise VocabError(f"{name}: cannot find the tokenizer vocabulary (tokenizer.ggml.tokens)")
    texts: list[bytes] = list(tokens.value)  # type: ignore[call-overload]
    n = len(texts)
    if n == 0:
        raise VocabError(f"{name}: the tokenizer vocabulary is empty")
    meta.array(KEY + "scores", (GgufType.INT32, GgufType.FLOAT32), n)
    for i in (i for i, text in enumerate(texts) if not text):
        texts[i] = f"[EMPTY_{i}]".encode()
    token_to_id = {text: i for i, text in enumerate(texts)}
    if len(token_to_id) != n:
        # llama.cpp asserts on this and aborts the whole process.
        raise VocabError(f"{name}: the vocabulary holds the same token text twice")
    attrs = _initial_attrs(meta, n)
    if model_name == "plamo2":
        _check_plamo2_bytes(name, texts, attrs)
    if model_name == "hybriddna" and b"<oov>" in token_to_id:
        texts = [_strip_marker(t) if i > token_to_id[b"<oov>"] else t for i, t in enumerate(texts)]

    eog = _end_of_generation(meta, model, attrs, token_to_id, texts)
    try:
        pieces = PIECE_DECODERS[model_name](texts, attrs, rules)
    except VocabError as exc:
        raise VocabError(f"{name}: {exc}") from None
    _strip_attributes(meta, pre, attrs, token_to_id)
    return GgufVocabContent(
        pieces=pieces,
        eog_ids=frozenset(eog),
        token_texts=[t.decode("utf-8", "surrogateescape") for t in texts],
        token_attrs=attrs.tolist(),
        tokenizer=rules,
    )


def _check_charsmap(meta: _Metadata) -> None:
    charsmap = meta.array(KEY + "precompiled_charsmap", (GgufType.INT8, GgufType.UINT8), 0)
    if charsmap is None:
        return
    blob: npt.NDArray[np.generic] = charsmap.value  # type: ignore[assignment]
    if blob.size < 4:
        raise VocabError(f"{meta.name}: precompiled_charsmap too small for its header")
    if int(blob[:4].view("<u4")[0]) + 4 >= blob.size:
        raise VocabError(f"{meta.name}: precompiled_charsmap points past its end")


def _check_plamo2_bytes(name: str, texts: Sequence[bytes], attrs: npt.NDArray[np.int32]) -> None:
    # PLaMo-2's tokenizer needs a byte token for each of the 256 bytes (one at id 0 does not count).
    found = set()
    for token in np.flatnonzero(attrs & int(A.BYTE)).tolist():
        text = texts[token]
        digits = text[3:5]
        if token and len(text) == 6 and text[:3] == b"<0x" and text[5:] == b">" and _is_hex(digits):
            found.add(int(digits, 16))
    if len(found) < 256:
        missing = min(set(range(256)) - found)
        raise VocabError(f"{name}: PLaMo-2 vocabulary without a byte token for <0x{missing:02X}>")


def _is_hex(digits: bytes) -> bool:
    return all(d in b"0123456789abcdefABCDEF" for d in digits)


def _initial_attrs(meta: _Metadata, n: int) -> npt.NDArray[np.int32]:
    types = meta.array(KEY + "token_type", (GgufType.INT32,), n)
    if types is None:
        return np.full(n, int(A.NORMAL), dtype=np.int32)
    table = np.zeros(max(_ATTR_OF_TYPE) + 1, dtype=np.int32)
    for kind, attr in _ATTR_OF_TYPE.items():
        table[kind] = int(attr)
    raw: npt.NDArray[np.int32] = types.value[:n]  # type: ignore[index]
    known = (raw >= 0) & (raw < table.size)
    return np.where(known, table[np.where(known, raw, 0)], int(A.UNDEFINED)).astype(np.int32)


def _strip_marker(text: bytes) -> bytes:
    if len(text) > len(_DNA_KMER_MARKER) and text.endswith(_DNA_KMER_MARKER):
        return text[: -len(_DNA_KMER_MARKER)]
    return text


def _special_ids(meta: _Metadata, model: _Model, n: int) -> dict[str, int]:
    slots = {key: model.defaults.get(key, _NONE) for key in _SPECIAL_KEYS if key not in _SLOT_OF_KEY}
    for slot, token in slots.items():
        if token >= n:
            slots[slot] = _NONE
    for key in _SPECIAL_KEYS:
        value = meta.get(f"{KEY}{key}_token_id", GgufType.UINT32)
        if value is not None and int(value) < n:  # type: ignore[call-overload]
            slots[_SLOT_OF_KEY.get(key, key)] = int(value)  # type: ignore[call-overload]
    return slots


def _end_of_generation(
    meta: _Metadata,
    model: _Model,
    attrs: npt.NDArray[np.int32],
    token_to_id: Mapping[bytes, int],
    texts: Sequence[bytes],
) -> set[int]:
    slots = _special_ids(meta, model, len(texts))
    control = int(A.CONTROL)

    def find(candidates: Sequence[str]) -> int:
        found = [token_to_id[c] for c in (t.encode() for t in candidates) if c in token_to_id]
        return min(found, default=_NONE)

    for slot, candidates in _SLOT_TEXTS.items():  # step 3
        if slots[slot] == _NONE:
            slots[slot] = token = find(candidates)
            if token != _NONE:
                attrs[token] |= control
    for token in np.flatnonzero(attrs & control).tolist():  # step 4
        if b"unused" in texts[token]:
            attrs[token] |= int(A.UNUSED)

    eog = {slots[s] for s in ("fim_pad", "fim_rep", "fim_sep") if slots[s] != _NONE}  # step 5
    for text in _EOG_TEXTS:
        token = token_to_id.get(text.encode(), _NONE)
        if token != _NONE:
            eog.add(token)
            attrs[token] |= control
    for text in _ALWAYS_RENDERED:
        if text.encode() in token_to_id:
            attrs[token_to_id[text.encode()]] = int(A.USER_DEFINED)
    eog.update(slots[s] for s in ("eos", "eot", "eom") if slots[s] != _NONE)

    eog_texts = {texts[t]: t for t in eog}
    has_call = b"<|call|>" in eog_texts or b"<|calls|>" in eog_texts
    if b"<|end|>" in eog_texts and has_call and (b"<|return|>" in eog_texts or b"<|flush|>" in eog_texts):
        end = eog_texts[b"<|end|>"]
        eog.discard(end)
        attrs[end] = int(A.USER_DEFINED)
    if b"</s>" in eog_texts and (b"<|tool_response>" in eog_texts or b"<|plamo:eos|>" in eog_texts):
        s = eog_texts[b"</s>"]
        eog.discard(s)
        attrs[s] = int(A.NORMAL)
    return eog


def _strip_attributes(
    meta: _Metadata, pre: str, attrs: npt.NDArray[np.int32], token_to_id: Mapping[bytes, int]
) -> None:
    # Step 7: llama.cpp sets these by model, tokenizer or architecture name, after the pieces are made.
    model_name = (meta.text("general.name") or "").lower()
    arch = meta.text("general.architecture") or ""

    def require(text: str) -> int:
        token = token_to_id.get(text.encode())
        if token is None:
            raise VocabError(f"{meta.name}: llama.cpp expects a {text!r} token in this vocabulary")
        return token

    setting: Callable[[int, TokenAttr, bool], None] = _set_attr(attrs)
    if any(p in pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        a in arch for a in ("nomic-bert-moe", "jina-bert-v3")
    ):
        if b"<mask>" in token_to_id:
            setting(token_to_id[b"<mask>"], A.LSTRIP, True)
    elif "phi-3" in model_name or "phi3" in model_name:
        special = np.flatnonzero(attrs & int(A.CONTROL | A.USER_DEFINED | A.UNKNOWN))
        attrs[special] |= int(A.RSTRIP)
        setting(require("</s>"), A.RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            setting(require(text), A.RSTRIP, False)
    elif "modern-bert" in model_name and b"[MASK]" in token_to_id:
        setting(token_to_id[b"[MASK]"], A.LSTRIP, True)


def _set_attr(attrs: npt.NDArray[np.int32]) -> Callable[[int, TokenAttr, bool], None]:
    def setting(token: int, attr: TokenAttr, value: bool) -> None:
        attrs[token] = (attrs[token] | int(attr)) if value else (attrs[token] & ~int(attr))

    return setting
