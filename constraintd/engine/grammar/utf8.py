# UTF-8 as llama.cpp's grammar decodes it: `decode_utf8(piece, partial_start)` in llama-grammar.cpp.
#
# Contract:
# - `decode_utf8(data, partial)` returns exactly the code points and end state llama.cpp computes, quirks
#   included: the bytes end at the first NUL (llama.cpp reads a C string); continuation bytes inside a
#   sequence are not checked (only their low six bits are taken); leads 0xF8-0xFF count as 4-byte leads
#   with four value bits; overlong forms and surrogates decode to their numeric value.
# - A sequence cut by the end of `data` is carried in the returned `PartialUtf8` (value so far, bytes still
#   missing) and finished by the next call.
# - Any invalid byte (a continuation byte where a sequence should start, or a non-continuation byte where a
#   partial sequence continues) makes the whole result `((), INVALID)`: llama.cpp drops every code point
#   of that piece, not only the bad one.
# - End states are normalized: llama.cpp keeps the last code point in `value` when nothing is missing, and
#   starts afresh after an invalid sequence; neither is observable, so both become `FRESH` (0, 0) here,
#   which lets end states serve as cache keys.
from __future__ import annotations

from typing import Final

__all__ = [
    "FRESH",
    "INVALID",
    "PartialUtf8",
    "decode_utf8",
    "sequence_length",
]

# (value of the bits read so far, bytes still missing); n_remain -1 marks an invalid sequence.
PartialUtf8 = tuple[int, int]

FRESH: Final[PartialUtf8] = (0, 0)
INVALID: Final[PartialUtf8] = (0, -1)

# Sequence length by the high nibble of its first byte; 0 for a continuation byte (llama.cpp's `lookup`).
_LENGTH_BY_HIGH_NIBBLE: Final = (1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4)


def sequence_length(first_byte: int) -> int:
    """Bytes in the sequence `first_byte` starts, as llama.cpp counts them (0: a continuation byte)."""
    return _LENGTH_BY_HIGH_NIBBLE[first_byte >> 4]


def decode_utf8(data: bytes, partial: PartialUtf8 = FRESH) -> tuple[tuple[int, ...], PartialUtf8]:
    """Decode `data` after a sequence `partial` left unfinished, as llama.cpp's grammar does.

    Returns:
        The code points completed in `data` (none when it is invalid) and the state it ends in: `FRESH`,
        an unfinished sequence, or `INVALID`.
    """
    if partial[1] <= 0 and data.isascii() and 0 not in data:
        # most pieces: ASCII, whose bytes are their code points (no text object, no codec lookup)
        return tuple(data), FRESH
    nul = data.find(0)
    if nul >= 0:
        data = data[:nul]
    if partial[1] <= 0:
        # The common case, a piece that is well-formed UTF-8 on its own: Python's strict decoder accepts
        # exactly the inputs on which llama.cpp's lenient one cannot differ from it.
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return _decode_exactly(data, FRESH)
        return tuple(map(ord, text)), FRESH
    return _decode_exactly(data, partial)


def _decode_exactly(data: bytes, partial: PartialUtf8) -> tuple[tuple[int, ...], PartialUtf8]:
    value, n_remain = partial
    size = len(data)
    pos = 0
    code_points: list[int] = []
    # finish the sequence the previous piece left open
    while pos < size and n_remain > 0:
        byte = data[pos]
        if byte >> 6 != 2:
            return (), INVALID
        value = (value << 6) + (byte & 0x3F)
        pos += 1
        n_remain -= 1
    if partial[1] > 0 and n_remain == 0:
        code_points.append(value)
    # then whole sequences, the last of which may be cut short
    while pos < size:
        byte = data[pos]
        n_remain = _LENGTH_BY_HIGH_NIBBLE[byte >> 4] - 1
        if n_remain < 0:
            return (), INVALID
        value = byte & ((1 << (7 - n_remain)) - 1)
        pos += 1
        while pos < size and n_remain > 0:
            value = (value << 6) + (data[pos] & 0x3F)
            pos += 1
            n_remain -= 1
        if n_remain == 0:
            code_points.append(value)
    if n_remain > 0:
        return tuple(code_points), (value, n_remain)
    return tuple(code_points), FRESH
