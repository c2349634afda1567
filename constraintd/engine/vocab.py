# A vocabulary as the grammar engine sees it: token id -> the bytes the grammar matches.
#
# Contract:
# - `piece(t)` is exactly llama.cpp's `token_to_piece(t, lstrip=0, special=true)`; the grammar engine
#   matches these bytes and nothing else. Pieces are held in one tuple of bytes, so a lookup is a
#   range check and a tuple index.
# - `is_eog(t)` is llama.cpp's `llama_vocab_is_eog`: the tokens the grammar allows only when complete.
# - A `Vocab` never changes after construction. What it derives lazily (the content hash, piece lengths,
#   the lookup tables of `token_for_text`) is a pure function of what it was built from.
# - Ids outside [0, len) raise `TokenError`; a vocabulary that cannot be built raises `VocabError`.
# Reading a GGUF file (token texts and types -> pieces, the end-of-generation set) lives in gguf_vocab.py.
from __future__ import annotations

import enum
import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from constraintd.errors import TokenError, VocabError

__all__ = ["TokenAttr", "TokenizerRules", "Vocab"]


class TokenAttr(enum.IntFlag):
    """llama.cpp's `llama_token_attr` bits, as it derives them from a GGUF's token types."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


# The tokens llama.cpp's tokenizer matches by their text before running the model's tokenizer
# (`cache_special_tokens`: control, user-defined and unknown tokens).
_SPECIAL = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)
_LSTRIP, _RSTRIP = int(TokenAttr.LSTRIP), int(TokenAttr.RSTRIP)


@dataclass(frozen=True, slots=True)
class TokenizerRules:
    """What `token_for_text` needs to know about the tokenizer that produced a vocabulary.

    Attributes:
        model: the GGUF `tokenizer.ggml.model` ("llama", "gpt2", "bert", "t5", "rwkv", "gemma4", ...).
        add_space_prefix: the tokenizer puts a space before the text (SentencePiece's dummy prefix).
        escape_whitespaces: a BPE vocabulary that spells spaces as U+2581 instead of byte-level BPE.
    """

    model: str
    add_space_prefix: bool = False
    escape_whitespaces: bool = False


_SPACE_MARK = "\u2581"  # SentencePiece's visible space


def _byte_level_image() -> dict[int, str]:
    # GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to U+0100 onwards.
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    image = {b: chr(b) for b in kept}
    extra = 0
    for b in range(256):
        if b not in image:
            image[b] = chr(256 + extra)
            extra += 1
    return image


BYTE_LEVEL_IMAGE: dict[int, str] = _byte_level_image()


def _spm_text(text: str, rules: TokenizerRules) -> str:
    prefix = " " if rules.add_space_prefix else ""
    return (prefix + text).replace(" ", _SPACE_MARK)


def _bpe_text(text: str, rules: TokenizerRules) -> str:
    if rules.escape_whitespaces:
        return text.replace(" ", _SPACE_MARK)
    return "".join(BYTE_LEVEL_IMAGE[b] for b in text.encode("utf-8", "surrogateescape"))


def _wpm_text(text: str, rules: TokenizerRules) -> str:
    # WordPiece starts every word with the visible space; a text holding punctuation or spaces is
    # several words, hence several tokens, which the lookup's miss reports.
    return _SPACE_MARK + text


def _verbatim_text(text: str, rules: TokenizerRules) -> str:
    return text


# How each tokenizer model spells a plain text in its token table (see `Vocab.token_for_text`).
_PLAIN_TEXT_SPELLING: dict[str, Callable[[str, TokenizerRules], str]] = {
    "llama": _spm_text,
    "t5": _spm_text,
    "gpt2": _bpe_text,
    "gemma4": _bpe_text,
    "hybriddna": _bpe_text,
    "whitespace": _bpe_text,
    "bert": _wpm_text,
    "plamo2": _verbatim_text,
}


class Vocab:
    """Token id -> piece bytes (as llama.cpp's grammar sampler matches them), and the end-of-generation set.

    Build one from a list (`Vocab(pieces, eog_ids)`) or from a GGUF file (`Vocab.from_gguf(path)`).
    Immutable and safe to share between threads and sessions.
    """

    __slots__ = (
        "_attrs",
        "_eog_ids",
        "_hash",
        "_n",
        "_piece_lengths",
        "_pieces",
        "_plain_by_piece",
        "_plain_by_text",
        "_rules",
        "_specials",
        "_texts",
    )

    def __init__(
        self,
        pieces: Sequence[bytes],
        eog_ids: Iterable[int] = (),
        *,
        token_texts: Sequence[str] | None = None,
        token_attrs: Sequence[int] | None = None,
        tokenizer: TokenizerRules | None = None,
    ) -> None:
        """Build a vocabulary from its pieces.

        Args:
            pieces: piece bytes of every token, indexed by token id.
            eog_ids: the end-of-generation tokens.
            token_texts: each token's text as the tokenizer spells it (GGUF `tokenizer.ggml.tokens`);
                `token_for_text` matches special tokens and plain text against these.
            token_attrs: each token's `TokenAttr` bits; control, user-defined and unknown tokens are the
                special tokens `token_for_text` matches by text. Needs `token_texts`.
            tokenizer: the tokenizer's rules for spelling plain text; without them a plain text names the
                token whose piece is exactly its UTF-8 bytes.

        Raises:
            VocabError: no tokens, a piece that is not bytes, an end-of-generation id outside the vocabulary,
                or texts/attributes whose count differs from the pieces'.
        """
        self._pieces: tuple[bytes, ...] = tuple(pieces)
        self._n = len(self._pieces)
        if self._n == 0:
            raise VocabError("a vocabulary needs at least one token")
        if not all(type(p) is bytes for p in self._pieces):
            bad = next(i for i, p in enumerate(self._pieces) if type(p) is not bytes)
            raise VocabError(f"piece of token {bad} is {type(self._pieces[bad]).__name__}, not bytes")
        eog = frozenset(eog_ids)
        outside = sorted(t for t in eog if not (type(t) is int and 0 <= t < self._n))
        if outside:
            raise VocabError(f"end-of-generation ids outside the vocabulary of {self._n}: {outside[:5]}")
        self._eog_ids = eog
        self._texts = None if token_texts is None else tuple(token_texts)
        if self._texts is not None and len(self._texts) != self._n:
            raise VocabError(f"{len(self._texts)} token texts for {self._n} pieces")
        if token_attrs is not None and self._texts is None:
            raise VocabError("token attributes need token texts")
        self._attrs = None if token_attrs is None else tuple(int(a) for a in token_attrs)
        if self._attrs is not None and len(self._attrs) != self._n:
            raise VocabError(f"{len(self._attrs)} token attributes for {self._n} pieces")
        self._rules = tokenizer
        self._hash: str | None = None
        self._piece_lengths: npt.NDArray[np.int32] | None = None
        self._specials: _SpecialTokens | None = None
        self._plain_by_piece: dict[bytes, int] | None = None
        self._plain_by_text: dict[str, int] | None = None

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> Vocab:
        """Read the vocabulary of a GGUF file as llama.cpp loads it (no llama.cpp needed).

        Raises:
            VocabError: the file is missing or unreadable, not a GGUF, holds no tokenizer, or uses a
                tokenizer model llama.cpp does not know.
        """
        from constraintd.engine.gguf_vocab import read_gguf_vocab

        content = read_gguf_vocab(path)
        return cls(
            content.pieces,
            content.eog_ids,
            token_texts=content.token_texts,
            token_attrs=content.token_attrs,
            tokenizer=content.tokenizer,
        )

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        model = f" {self._rules.model!r}" if self._rules else ""
        return f"<Vocab{model} {self._n} tokens, {len(self._eog_ids)} eog, {self.content_hash[:12]}>"

    def piece(self, token: int) -> bytes:
        """The bytes of `token` the grammar matches: llama.cpp's `token_to_piece(token, 0, special=true)`.

        Raises:
            TokenError: `token` is outside the vocabulary.
        """
        if 0 <= token < self._n:
            return self._pieces[token]
        raise TokenError(f"token {token} is outside the vocabulary of {self._n}")

    def is_eog(self, token: int) -> bool:
        """Whether `token` ends generation (llama.cpp's `llama_vocab_is_eog`).

        Raises:
            TokenError: `token` is outside the vocabulary.
        """
        if 0 <= token < self._n:
            return token in self._eog_ids
        raise TokenError(f"token {token} is outside the vocabulary of {self._n}")

    @property
    def pieces(self) -> tuple[bytes, ...]:
        """Every token's piece, indexed by token id."""
        return self._pieces

    @property
    def eog_ids(self) -> frozenset[int]:
        """The end-of-generation tokens."""
        return self._eog_ids

    @property
    def token_texts(self) -> tuple[str, ...] | None:
        """Each token's text as its tokenizer spells it, when known."""
        return self._texts

    @property
    def token_attrs(self) -> tuple[int, ...] | None:
        """Each token's `TokenAttr` bits, when known."""
        return self._attrs

    @property
    def tokenizer(self) -> TokenizerRules | None:
        """The tokenizer's rules, for a vocabulary read from GGUF."""
        return self._rules

    @property
    def model(self) -> str:
        """The tokenizer model name ("llama", "gpt2", ...); empty for a vocabulary built from a list."""
        return self._rules.model if self._rules else ""

    @property
    def piece_lengths(self) -> npt.NDArray[np.int32]:
        """Byte length of every piece (read-only, built on first use)."""
        if self._piece_lengths is None:
            lengths = np.fromiter(map(len, self._pieces), dtype=np.int32, count=self._n)
            lengths.flags.writeable = False
            self._piece_lengths = lengths
        return self._piece_lengths

    @property
    def content_hash(self) -> str:
        """SHA-256 (hex) of everything that defines this vocabulary; the same in every run and process."""
        if self._hash is None:
            self._hash = _content_hash(self)
        return self._hash

    def token_for_text(self, text: str) -> int | None:
        """The single token llama.cpp's tokenizer makes of `text`, or None if it makes zero or several.

        This is how llama.cpp's GBNF parser resolves a `<...>` terminal: it tokenizes the whole terminal,
        brackets included (`<|im_end|>`), with special tokens parsed and no BOS/EOS, and requires exactly
        one token. So pass the terminal as written, brackets and all.

        Special tokens (control, user-defined, unknown) are found exactly as llama.cpp's tokenizer splits
        text around them, longest text first, LSTRIP / RSTRIP tokens eating the whitespace beside them.
        A text that is not one special token must be one plain token: that is decided by spelling the
        text as the tokenizer would (SentencePiece's space prefix and U+2581 spaces, byte-level BPE's
        byte image, WordPiece's word mark) and looking the spelling up among the token texts; for RWKV,
        and for vocabularies built from a list without a tokenizer, among the pieces. This is where it
        approximates llama.cpp: the tokenizer itself is not run, so for a text whose spelling is a token
        but which the tokenizer would split (a BPE pre-tokenizer boundary, a merge order that never builds
        the token, WordPiece or Unigram normalisation) it returns that token where llama.cpp makes several,
        and a text the tokenizer turns into one token some other way (a single byte-fallback token) is
        missed. Special tokens with the same byte length that overlap in the text are tried in id order
        (llama.cpp's order among them is unspecified).
        """
        if not text:
            return None  # llama.cpp makes no token of it
        if self._specials is None:
            self._specials = _SpecialTokens(self._texts or (), self._attrs or ())
        fragments = self._specials.split(text.encode("utf-8", "surrogateescape"))
        if len(fragments) != 1:
            return None
        fragment = fragments[0]
        if isinstance(fragment, int):
            return fragment
        return self._plain_token(fragment)

    def _plain_token(self, data: bytes) -> int | None:
        rules = self._rules
        spell = _PLAIN_TEXT_SPELLING.get(rules.model) if rules is not None else None
        if rules is None or self._texts is None or spell is None:
            # No tokenizer to imitate (or a tokenizer that works on raw bytes, like RWKV's greedy
            # longest match, which yields one token exactly when the bytes are a piece).
            if self._plain_by_piece is None:
                by_piece: dict[bytes, int] = {}
                for token, piece in enumerate(self._pieces):
                    by_piece.setdefault(piece, token)
                self._plain_by_piece = by_piece
            return self._plain_by_piece.get(data)
        if self._plain_by_text is None:
            # llama.cpp's token_to_id: a text names the last token carrying it.
            self._plain_by_text = {text: token for token, text in enumerate(self._texts)}
        return self._plain_by_text.get(spell(data.decode("utf-8", "surrogateescape"), rules))


Fragment = bytes | int  # raw text still to tokenize, or a special token found in it


class _SpecialTokens:
    """llama.cpp's `cache_special_tokens` and the split of text around them (`tokenizer_st_partition`)."""

    __slots__ = ("by_length",)

    def __init__(self, texts: Sequence[str], attrs: Sequence[int]) -> None:
        tables: dict[int, dict[bytes, tuple[int, int]]] = {}
        for token, (text, attr) in enumerate(zip(texts, attrs, strict=True)):
            if attr & _SPECIAL and text:
                data = text.encode("utf-8", "surrogateescape")
                tables.setdefault(len(data), {}).setdefault(data, (token, attr))
        # llama.cpp tries them longest first
        self.by_length = sorted(tables.items(), reverse=True)

    def split(self, data: bytes) -> list[Fragment]:
        """Cut `data` around the special tokens in it, as llama.cpp's tokenizer does with parse_special."""
        fragments: list[Fragment] = [data]
        for text, token, attr in self._found_in(data):
            cut: list[Fragment] = []
            for fragment in fragments:
                if isinstance(fragment, int) or text not in fragment:
                    cut.append(fragment)
                    continue
                rest = fragment
                while (at := rest.find(text)) >= 0:
                    left, rest = rest[:at], rest[at + len(text) :]
                    if attr & _LSTRIP:
                        left = left.rstrip(_C_SPACE)
                    if left:
                        cut.append(left)
                    cut.append(token)
                    if attr & _RSTRIP:
                        rest = rest.lstrip(_C_SPACE)
                if rest:
                    cut.append(rest)
            fragments = cut
        return fragments

    def _found_in(self, data: bytes) -> list[tuple[bytes, int, int]]:
        # Only a special token occurring in `data` can cut one of its fragments. Looking up every
        # substring of each length costs len(data) x (distinct lengths) dictionary probes, instead of a
        # search for each of the thousands of special tokens some vocabularies have.
        found: list[tuple[bytes, int, int]] = []
        for length, table in self.by_length:
            here = {
                data[i : i + length]: table[data[i : i + length]]
                for i in range(len(data) - length + 1)
                if data[i : i + length] in table
            }
            found.extend(sorted(((text, *entry) for text, entry in here.items()), key=lambda e: e[1]))
        return found


_C_SPACE = b" \t\n\v\f\r"  # C's isspace in the "C" locale


def _content_hash(vocab: Vocab) -> str:
    # Every part is written with its length first, so no two different vocabularies give the same stream.
    digest = hashlib.sha256(b"constraintd vocab 1")

    def part(payload: bytes) -> None:
        digest.update(len(payload).to_bytes(8, "little"))
        digest.update(payload)

    part(vocab.piece_lengths.astype("<u4").tobytes())
    part(b"".join(vocab.pieces))
    part(np.array(sorted(vocab.eog_ids), dtype="<u4").tobytes())
    texts = vocab.token_texts
    if texts is None:
        part(b"")
    else:
        encoded = [t.encode("utf-8", "surrogateescape") for t in texts]
        part(np.fromiter(map(len, encoded), dtype="<u4", count=len(encoded)).tobytes())
        part(b"".join(encoded))
    attrs = vocab.token_attrs
    part(b"" if attrs is None else np.array(attrs, dtype="<u4").tobytes())
    rules = vocab.tokenizer
    spec = (
        ""
        if rules is None
        else f"{rules.model}\0{int(rules.add_space_prefix)}\0{int(rules.escape_whitespaces)}"
    )
    part(spec.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()
