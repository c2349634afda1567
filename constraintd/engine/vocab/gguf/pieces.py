# Token text + attributes -> piece bytes, per tokenizer model: llama.cpp's `token_to_piece` with
# special=true and lstrip=0, which is what its grammar sampler matches.
#
# Contract: `PIECE_DECODERS[model](texts, attrs, rules)` returns one piece per token, byte for byte what
# llama.cpp caches in `cache_token_to_piece` for a vocabulary whose token texts and attributes (after
# llama.cpp's load-time fixes, see vocab/gguf/reader.py) are `texts` and `attrs`:
# - SentencePiece, WordPiece, Unigram ("llama", "bert", "t5"): control / unknown / user-defined tokens
#   give their text; normal tokens their text with U+2581 turned into spaces; byte tokens (`<0xAB>`)
#   their byte (WordPiece has none: llama.cpp aborts on them, we refuse); anything else (unused,
#   undefined) nothing.
# - BPE ("gpt2", "gemma4", ...): the same, except a normal token's text is decoded from GPT-2's byte
#   image (or, for vocabularies that spell spaces as U+2581, unescaped like SentencePiece).
# - RWKV: every text unescaped (`\n`, `\t`, `\r`, `\xAB`, `\c`), whatever its attributes.
# - PLaMo-2: byte tokens their byte, every other token its text as is.
# - "test": the token id in lowercase hexadecimal.
# Malformed texts are decoded the way llama.cpp's C code does (lenient UTF-8 with U+FFFD, strtol), so the
# pieces match even for odd vocabularies.
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import numpy.typing as npt

from constraintd.engine.vocab.token_lookup import BYTE_LEVEL_IMAGE, TokenAttr, TokenizerRules
from constraintd.errors import VocabError

__all__ = ["PIECE_DECODERS"]

Decoder = Callable[[Sequence[bytes], npt.NDArray[np.int32], TokenizerRules], list[bytes]]

_SPACE_MARK = "\u2581".encode()
_SPECIAL = int(TokenAttr.UNKNOWN | TokenAttr.CONTROL | TokenAttr.USER_DEFINED)

# Which rule a token follows, in llama.cpp's order of tests: text as is, normal, byte, nothing.
_AS_TEXT, _NORMAL, _BYTE, _NOTHING = 0, 1, 2, 3


def _rule_of_each(attrs: npt.NDArray[np.int32]) -> npt.NDArray[np.int8]:
    rule = np.full(attrs.shape, _NOTHING, dtype=np.int8)
    rule[(attrs & int(TokenAttr.BYTE)) != 0] = _BYTE
    rule[(attrs & int(TokenAttr.NORMAL)) != 0] = _NORMAL
    rule[(attrs & _SPECIAL) != 0] = _AS_TEXT
    return rule


_C_SPACE = b" \t\n\v\f\r"
_HEX = b"0123456789abcdefABCDEF"


def _byte_of(text: bytes) -> bytes:
    # token_to_byte: strtol(text.substr(3, 2), NULL, 16), kept to its low 8 bits.
    if len(text) < 3:
        raise VocabError(f"byte token {text!r} is too short to hold a byte (llama.cpp fails to load it)")
    digits = text[3:5].lstrip(_C_SPACE)
    negative = digits[:1] == b"-"
    if digits[:1] in (b"-", b"+"):
        digits = digits[1:]
    if digits[:2].lower() == b"0x" and digits[2:3] and digits[2:3] in _HEX:
        digits = digits[2:]
    end = 0
    while end < len(digits) and digits[end : end + 1] in _HEX:
        end += 1
    value = int(digits[:end], 16) if end else 0
    return bytes([(-value if negative else value) & 0xFF])


def _spm_pieces(texts: Sequence[bytes], attrs: npt.NDArray[np.int32], rules: TokenizerRules) -> list[bytes]:
    return _by_rule(texts, attrs, _unescape_spaces)


def _unescape_spaces(text: bytes) -> bytes:
    return text.replace(_SPACE_MARK, b" ")


def _wpm_pieces(texts: Sequence[bytes], attrs: npt.NDArray[np.int32], rules: TokenizerRules) -> list[bytes]:
    byte = np.flatnonzero(_rule_of_each(attrs) == _BYTE)
    if byte.size:
        # token_to_byte has no WordPiece case: llama.cpp aborts the process on such a vocabulary.
        raise VocabError(f"a WordPiece vocabulary cannot have byte tokens ({texts[int(byte[0])]!r})")
    return _spm_pieces(texts, attrs, rules)


def _bpe_pieces(texts: Sequence[bytes], attrs: npt.NDArray[np.int32], rules: TokenizerRules) -> list[bytes]:
    if rules.escape_whitespaces:
        return _spm_pieces(texts, attrs, rules)
    return _by_rule(texts, attrs, _decode_byte_level)


def _by_rule(
    texts: Sequence[bytes], attrs: npt.NDArray[np.int32], normal: Callable[[bytes], bytes | None]
) -> list[bytes]:
    # Most tokens are normal: decode every text in one C-level pass, then redo the few that are not.
    decoded = list(map(normal, texts))
    rule = _rule_of_each(attrs)
    for token in np.flatnonzero(rule != _NORMAL).tolist():
        kind = rule[token]
        decoded[token] = (
            texts[token] if kind == _AS_TEXT else _byte_of(texts[token]) if kind == _BYTE else b""
        )
    if None in decoded:
        bad = texts[decoded.index(None)]
        raise VocabError(f"token text {bad!r} decodes to an invalid code point (llama.cpp fails to load it)")
    return cast(list[bytes], decoded)


# GPT-2's byte image, inverted: image character -> the byte it stands for. Characters below U+0144
# that are not in the image are deleted by translate(), which the length check then catches.
_UNIMAGE: dict[int, str | None] = {cp: None for cp in range(0x144)}
_UNIMAGE.update({ord(char): chr(byte) for byte, char in BYTE_LEVEL_IMAGE.items()})
_BYTE_OF_IMAGE: dict[int, int] = {ord(char): byte for byte, char in BYTE_LEVEL_IMAGE.items()}


def _decode_byte_level(text: bytes) -> bytes | None:
    # llama_decode_text. Fast path: valid UTF-8 made only of image characters.
    try:
        chars = text.decode("utf-8")
    except UnicodeDecodeError:
        return _decode_byte_level_slowly(text)
    out = chars.translate(_UNIMAGE)
    if len(out) == len(chars):
        try:
            return out.encode("latin-1")
        except UnicodeEncodeError:
            pass
    return _decode_byte_level_slowly(text)


def _decode_byte_level_slowly(text: bytes) -> bytes | None:
    out = bytearray()
    for cp in _code_points(text):
        byte = _BYTE_OF_IMAGE.get(cp)
        if byte is not None:
            out.append(byte)
            continue
        if cp > 0x10FFFF:
            return None  # llama.cpp throws; the caller refuses the vocabulary if the token is normal
        # llama.cpp's marker for a character outside the image, whole token text included.
        out += b"[UNK_BYTE_0x" + chr(cp).encode("utf-8", "surrogatepass").hex().encode() + text + b"]"
    return bytes(out)


def _code_points(data: bytes) -> list[int]:
    # unicode_cpts_from_utf8: no check for overlong forms or surrogates; a bad sequence gives U+FFFD
    # and skips one byte.
    cps: list[int] = []
    i, n = 0, len(data)
    while i < n:
        b = data[i]
        size = (
            1 if b < 0x80 else 0 if b < 0xC0 else 2 if b < 0xE0 else 3 if b < 0xF0 else 4 if b < 0xF8 else 0
        )
        if size == 1:
            cps.append(b)
        elif size and i + size <= n and all(0x80 <= c < 0xC0 for c in data[i + 1 : i + size]):
            cp = b & (0x7F >> size)
            for c in data[i + 1 : i + size]:
                cp = (cp << 6) | (c & 0x3F)
            cps.append(cp)
        else:
            cps.append(0xFFFD)
            size = 1
        i += size
    return cps


def _rwkv_pieces(texts: Sequence[bytes], attrs: npt.NDArray[np.int32], rules: TokenizerRules) -> list[bytes]:
    return [_unescape_rwkv(text) if b"\\" in text else text for text in texts]


_RWKV_ESCAPES = {ord("t"): 9, ord("n"): 10, ord("r"): 13}


def _unescape_rwkv(text: bytes) -> bytes:
    # llama_unescape_rwkv_token, including its arithmetic on bytes that are not hex digits.
    out = bytearray()
    escaping = False
    hex_left = acc = 0
    for c in text:
        if hex_left:
            value = (c - ord("a") + 10 if c >= ord("a") else c - ord("0")) & 0xFF
            acc = ((acc << 4) + value) & 0xFF
            hex_left -= 1
            if not hex_left:
                out.append(acc)
                acc = 0
        elif escaping:
            if c == ord("x"):
                hex_left = 2
            else:
                out.append(_RWKV_ESCAPES.get(c, c))
            escaping = False
        elif c == ord("\\"):
            escaping = True
        else:
            out.append(c)
    return bytes(out)


def _plamo2_pieces(
    texts: Sequence[bytes], attrs: npt.NDArray[np.int32], rules: TokenizerRules
) -> list[bytes]:
    is_byte = ((attrs & int(TokenAttr.BYTE)) != 0).tolist()
    return [
        bytes([int(text[3:5], 16)])
        if byte and len(text) == 6 and text[:3] == b"<0x" and text[5:] == b">" and _all_hex(text[3:5])
        else text
        for text, byte in zip(texts, is_byte, strict=True)
    ]


def _all_hex(digits: bytes) -> bool:
    return all(d in _HEX for d in digits)


def _test_pieces(texts: Sequence[bytes], attrs: npt.NDArray[np.int32], rules: TokenizerRules) -> list[bytes]:
    return [f"{token:x}".encode() for token in range(len(texts))]


PIECE_DECODERS: dict[str, Decoder] = {
    "llama": _spm_pieces,
    "bert": _wpm_pieces,
    "t5": _spm_pieces,
    "gpt2": _bpe_pieces,
    "gemma4": _bpe_pieces,
    "hybriddna": _bpe_pieces,
    "whitespace": _bpe_pieces,
    "rwkv": _rwkv_pieces,
    "plamo2": _plamo2_pieces,
    "test": _test_pieces,
}
