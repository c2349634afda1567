# A vocabulary as the grammar engine sees it: token id -> the bytes the grammar matches.
#
# Contract:
# - `piece(t)` is exactly llama.cpp's `token_to_piece(t, lstrip=0, special=true)`; the grammar engine
#   matches these bytes and nothing else. Pieces are held in one tuple of bytes, so a lookup is a
#   range check and a tuple index.
# - `is_eog(t)` is llama.cpp's `llama_vocab_is_eog`: the tokens the grammar allows only when complete.
# - A `Vocab` never changes after construction. What it derives lazily (the content hash, piece lengths,
#   the lookup tables of `token_for_text`, the pieces decoded for masks with what masks learn about them,
#   vocab/decoded.py) it owns: a pure function of what it was built from, or a cache that never changes
#   an answer.
# - Ids outside [0, len) raise `TokenError`; a vocabulary that cannot be built raises `VocabError`.
# Reading a GGUF file (token texts and types -> pieces, the end-of-generation set) lives in
# gguf/reader.py; finding the token a text names (`token_for_text`) in token_lookup.py.
from __future__ import annotations

import hashlib
import operator
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from constraintd.engine.vocab.token_lookup import TokenAttr, TokenizerRules, TokenLookup
from constraintd.errors import TokenError, VocabError

if TYPE_CHECKING:
    from constraintd.engine.vocab.decoded import DecodedVocab

__all__ = ["TokenAttr", "TokenizerRules", "Vocab"]


class Vocab:
    """Token id -> piece bytes (as llama.cpp's grammar sampler matches them), and the end-of-generation set.

    Build one from a list (`Vocab(pieces, eog_ids)`) or from a GGUF file (`Vocab.from_gguf(path)`).
    Immutable and safe to share between threads and sessions.
    """

    __slots__ = (
        "_attrs",
        "_decoded",
        "_eog_ids",
        "_hash",
        "_lookup",
        "_n",
        "_piece_lengths",
        "_pieces",
        "_rules",
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
        if set(map(type, self._pieces)) != {bytes}:
            bad = next(i for i, p in enumerate(self._pieces) if type(p) is not bytes)
            raise VocabError(f"piece of token {bad} is {type(self._pieces[bad]).__name__}, not bytes")
        try:
            eog = frozenset(operator.index(t) for t in eog_ids)  # numpy integers too, not floats
        except TypeError:
            raise VocabError("end-of-generation ids must be integers") from None
        outside = sorted(t for t in eog if not 0 <= t < self._n)
        if outside:
            raise VocabError(f"end-of-generation ids outside the vocabulary of {self._n}: {outside[:5]}")
        self._eog_ids = eog
        self._texts = None if token_texts is None else tuple(token_texts)
        if self._texts is not None and len(self._texts) != self._n:
            raise VocabError(f"{len(self._texts)} token texts for {self._n} pieces")
        if token_attrs is not None and self._texts is None:
            raise VocabError("token attributes need token texts")
        self._attrs = None if token_attrs is None else tuple(map(int, token_attrs))
        if self._attrs is not None and len(self._attrs) != self._n:
            raise VocabError(f"{len(self._attrs)} token attributes for {self._n} pieces")
        self._rules = tokenizer
        self._hash: str | None = None
        self._piece_lengths: npt.NDArray[np.int32] | None = None
        self._lookup: TokenLookup | None = None
        self._decoded: DecodedVocab | None = None

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> Vocab:
        """Read the vocabulary of a GGUF file as llama.cpp loads it (no llama.cpp needed).

        Raises:
            VocabError: the file is missing or unreadable, not a GGUF, holds no tokenizer, or uses a
                tokenizer model llama.cpp does not know.
        """
        from constraintd.engine.vocab.gguf.reader import read_gguf_vocab

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

        Exact for special tokens (control, user-defined, unknown), which are found as llama.cpp's
        tokenizer finds them. A plain text is spelled as the tokenizer model spells its token texts
        (SentencePiece's space prefix and U+2581 spaces, byte-level BPE's byte image, WordPiece's word
        mark) and looked up, without running the tokenizer: for a text whose spelling is a token but that
        the tokenizer would split (a BPE pre-tokenizer boundary, a merge order that never builds it,
        normalisation not imitated) this returns the token where llama.cpp makes several, and a text the
        tokenizer makes into one token some other way (a lone byte-fallback or unknown token) gives None.
        See engine/vocab/token_lookup.py. Builds its tables on first use; does not change the vocabulary.
        """
        if self._lookup is None:
            self._lookup = TokenLookup(self._pieces, self._texts, self._attrs, self._rules)
        return self._lookup.token_for_text(text)


    def decoded(self, *, prebuilt: DecodedVocab | None = None) -> DecodedVocab:
        """The pieces decoded as the grammar decodes them, laid out for whole-vocabulary masks
        (vocab/decoded.py): built on first use, then held by this vocabulary and shared by every grammar
        compiled over it. Does not change what the vocabulary answers.

        Args:
            prebuilt: this vocabulary's decoded tables as built before (the service's vocabulary store
                reads them from disk): held from now on if none is held yet.
        """
        decoded = self._decoded
        if decoded is None:
            if prebuilt is None:
                from constraintd.engine.vocab.decoded import DecodedVocab  # it imports this module

                prebuilt = DecodedVocab(self)
            decoded = self._decoded = prebuilt
        return decoded


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
        part(np.fromiter(map(len, texts), dtype="<u4", count=len(texts)).tobytes())  # in code points
        part("".join(texts).encode("utf-8", "surrogateescape"))
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
