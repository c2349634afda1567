# The single token llama.cpp's tokenizer makes of a text: how a GBNF `<...>` terminal names a token.
#
# Contract: `TokenLookup.token_for_text(text)` returns the token llama.cpp's
# `tokenize(text, add_special=false, parse_special=true)` returns when it returns exactly one, else None.
# - Special tokens (control, user-defined, unknown: llama.cpp's `cache_special_tokens`) are found in the
#   text exactly as `tokenizer_st_partition` does: longest text first, every occurrence cut out, LSTRIP /
#   RSTRIP tokens eating the C-locale whitespace beside them. A text that leaves one special token and
#   nothing else is that token.
# - A text with no special token in it is spelled the way the tokenizer model spells text in its token
#   table (`PLAIN_TEXT_SPELLING`) and looked up there. This is the one approximation: the tokenizer is not
#   run, so a text whose spelling is a token but that the tokenizer would split (a BPE pre-tokenizer
#   boundary, a merge order that never builds the token, Unigram scores, normalisation we do not
#   imitate) is answered with that token, and a text the tokenizer makes into one token some other way
#   (a lone byte-fallback token, WordPiece's unknown token) is answered None.
# - Without a tokenizer model (a vocabulary built from a list), and for RWKV whose greedy longest match
#   makes one token exactly when the bytes are a token, a plain text is looked up among the pieces.
from __future__ import annotations

import enum
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["BYTE_LEVEL_IMAGE", "PLAIN_TEXT_SPELLING", "TokenAttr", "TokenLookup", "TokenizerRules"]


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


_SPECIAL = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)
_LSTRIP, _RSTRIP = int(TokenAttr.LSTRIP), int(TokenAttr.RSTRIP)
_C_SPACE = b" \t\n\v\f\r"  # C's isspace in the "C" locale
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


def _spm_text(text: str, rules: TokenizerRules) -> str | None:
    prefix = " " if rules.add_space_prefix else ""
    return (prefix + text).replace(" ", _SPACE_MARK)


def _bpe_text(text: str, rules: TokenizerRules) -> str | None:
    if rules.escape_whitespaces:
        return text.replace(" ", _SPACE_MARK)
    return "".join(BYTE_LEVEL_IMAGE[b] for b in text.encode("utf-8", "surrogateescape"))


def _ugm_text(text: str, rules: TokenizerRules) -> str | None:
    # The whitespace part of the Unigram normaliser, with `remove_extra_whitespaces` on (as the T5-style
    # vocabularies have it): each run of non-spaces gets one visible space before it. The precompiled
    # character map's normalisation is not imitated.
    words = text.split(" ")
    return "".join(_SPACE_MARK + w for w in words if w) if text.strip(" ") else None


def _wpm_text(text: str, rules: TokenizerRules) -> str | None:
    # WordPiece's pre-processing (lowercase, accents stripped, split at whitespace, punctuation, ASCII
    # symbols and CJK characters), then the visible space before the word. Several words are several
    # tokens. Python's Unicode tables stand in for llama.cpp's.
    words: list[str] = [""]
    for char in unicodedata.normalize("NFD", text):
        kind = unicodedata.category(char)
        if char.isspace():
            words.append("")
        elif char in ("\0", "\ufffd") or kind in ("Cc", "Cf", "Mn"):
            continue
        elif kind[0] == "P" or (ord(char) < 0x7F and kind[0] == "S") or _is_cjk(ord(char)):
            words += [char, ""]
        else:
            words[-1] += char.lower()
    words = [w for w in words if w]
    return _SPACE_MARK + words[0] if len(words) == 1 else None


def _is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK)


_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))  # fmt: skip


def _verbatim_text(text: str, rules: TokenizerRules) -> str | None:
    return text


# How each tokenizer model spells a plain text in its token table; None: certainly several tokens.
PLAIN_TEXT_SPELLING: dict[str, Callable[[str, TokenizerRules], str | None]] = {
    "llama": _spm_text,
    "t5": _ugm_text,
    "gpt2": _bpe_text,
    "gemma4": _bpe_text,
    "hybriddna": _bpe_text,
    "whitespace": _bpe_text,
    "bert": _wpm_text,
    "plamo2": _verbatim_text,
}

Fragment = bytes | int  # raw text still to tokenize, or a special token found in it


class SpecialTokens:
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
        # search for each of the thousands of special tokens some vocabularies have. Among tokens of one
        # length, id order (llama.cpp's std::sort leaves their order unspecified).
        found: list[tuple[bytes, int, int]] = []
        for length, table in self.by_length:
            here = {
                data[i : i + length]: table[data[i : i + length]]
                for i in range(len(data) - length + 1)
                if data[i : i + length] in table
            }
            found.extend(sorted(((text, *entry) for text, entry in here.items()), key=lambda e: e[1]))
        return found


class TokenLookup:
    """Text -> the single token llama.cpp's tokenizer makes of it; built once per vocabulary."""

    __slots__ = ("by_piece", "by_text", "rules", "specials", "spell")

    def __init__(
        self,
        pieces: Sequence[bytes],
        texts: Sequence[str] | None,
        attrs: Sequence[int] | None,
        rules: TokenizerRules | None,
    ) -> None:
        self.specials = SpecialTokens(texts or (), attrs or ())
        self.rules = rules
        self.spell = PLAIN_TEXT_SPELLING.get(rules.model) if rules is not None and texts is not None else None
        self.by_text: dict[str, int] = {}
        self.by_piece: dict[bytes, int] = {}
        if self.spell is not None and texts is not None:
            # llama.cpp's token_to_id: a text names the last token carrying it.
            self.by_text = {text: token for token, text in enumerate(texts)}
        else:
            for token, piece in enumerate(pieces):
                self.by_piece.setdefault(piece, token)

    def token_for_text(self, text: str) -> int | None:
        """See `Vocab.token_for_text`."""
        if not text:
            return None  # llama.cpp makes no token of it
        fragments = self.specials.split(text.encode("utf-8", "surrogateescape"))
        if len(fragments) != 1:
            return None
        fragment = fragments[0]
        if isinstance(fragment, int):
            return fragment
        if self.spell is None or self.rules is None:
            return self.by_piece.get(fragment)
        spelled = self.spell(fragment.decode("utf-8", "surrogateescape"), self.rules)
        return None if spelled is None else self.by_text.get(spelled)
