"""decode_utf8: llama.cpp's grammar decoder, partial sequences and invalid bytes included."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from constraintd.engine.grammar.utf8 import (
    FRESH,
    INVALID,
    PartialUtf8,
    _decode_exactly,
    decode_utf8,
    sequence_length,
)

CASES = [
    # (data, partial at start, code points, partial at end)
    (b"", FRESH, (), FRESH),
    (b"abc", FRESH, (0x61, 0x62, 0x63), FRESH),
    ("é中😀".encode(), FRESH, (0xE9, 0x4E2D, 0x1F600), FRESH),
    (b"a\xe4\xb8", FRESH, (0x61,), (0x4 << 6 | 0x38, 1)),
    (b"\xad", (0x4 << 6 | 0x38, 1), (0x4E2D,), FRESH),
    (b"\xadb", (0x4 << 6 | 0x38, 1), (0x4E2D, 0x62), FRESH),
    (b"\xe4", FRESH, (), (0x4, 2)),
    (b"\xb8", (0x4, 2), (), (0x4 << 6 | 0x38, 1)),
    (b"\xf0\x9f", FRESH, (), (0x0 << 6 | 0x1F, 2)),
    # a continuation byte where a sequence starts: the whole piece counts for nothing
    (b"\x80", FRESH, (), INVALID),
    (b"abc\x80", FRESH, (), INVALID),
    # a non-continuation byte where the partial sequence needs one
    (b"a", (0x4, 2), (), INVALID),
    # continuation bytes inside a sequence are not checked, only their low six bits are read
    (b"\xe4a\xad", FRESH, ((0x4 << 12) | (0x21 << 6) | 0x2D,), FRESH),
    # overlong forms and surrogates decode to their value
    (b"\xc0\x80", FRESH, (0,), FRESH),
    (b"\xed\xa0\x80", FRESH, (0xD800,), FRESH),
    # 0xF8-0xFF count as 4-byte leads with four value bits
    (b"\xff\xbf\xbf\xbf", FRESH, (0x3FFFFF,), FRESH),
    # the piece ends at the first NUL, as a C string
    (b"ab\x00cd", FRESH, (0x61, 0x62), FRESH),
    (b"\x00", FRESH, (), FRESH),
    (b"\xe4\x00\xad", FRESH, (), (0x4, 2)),
    # an invalid start state decodes afresh
    (b"a", INVALID, (0x61,), FRESH),
]


@pytest.mark.parametrize(
    ("data", "start", "code_points", "end"), CASES, ids=[f"{c[0]!r}-{c[1]}" for c in CASES]
)
def test_decode(data: bytes, start: PartialUtf8, code_points: tuple[int, ...], end: PartialUtf8) -> None:
    assert decode_utf8(data, start) == (code_points, end)


@given(st.binary(max_size=12))
def test_fast_path_agrees_with_the_exact_decoder(data: bytes) -> None:
    nul = data.find(0)
    expected = _decode_exactly(data[:nul] if nul >= 0 else data, FRESH)
    assert decode_utf8(data) == expected


@given(st.text(max_size=8), st.data())
def test_a_text_split_anywhere_decodes_to_its_code_points(text: str, data: st.DataObject) -> None:
    encoded = text.replace("\0", "").encode()
    cut = data.draw(st.integers(0, len(encoded)))
    head, partial = decode_utf8(encoded[:cut])
    tail, end = decode_utf8(encoded[cut:], partial)
    assert head + tail == tuple(map(ord, text.replace("\0", "")))
    assert end == FRESH


@pytest.mark.parametrize(
    ("first", "length"),
    [(0x41, 1), (0x7F, 1), (0x80, 0), (0xBF, 0), (0xC3, 2), (0xE4, 3), (0xF0, 4), (0xFF, 4)],
    ids=lambda v: hex(v) if v > 4 else str(v),
)
def test_sequence_length(first: int, length: int) -> None:
    assert sequence_length(first) == length
