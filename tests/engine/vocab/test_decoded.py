"""The decoded vocabulary: token kinds, and the column tables the mask walks."""

from __future__ import annotations

from constraintd.engine.grammar.utf8 import decode_utf8
from constraintd.engine.vocab.decoded import (
    END_OF_GENERATION,
    NEVER,
    PLAIN,
    decode_partial,
    decoded_vocab,
    encode_partial,
)
from constraintd.engine.vocab.vocab import Vocab

PIECES = [
    b"</s>",
    b"",
    b"\x00x",
    b"ab",
    "中".encode(),
    b"abc",
    b"\xe4",
    b"\xb8\xad",
    b"\xad!",
    b"\x80\x80",
    b"\x80",
]
VOCAB = Vocab(PIECES, eog_ids=[0])


def test_kinds() -> None:
    kinds = decoded_vocab(VOCAB).kinds.tolist()
    assert kinds[:4] == [END_OF_GENERATION, NEVER, NEVER, PLAIN]
    assert set(kinds[3:]) == {PLAIN}


def test_shared_by_content() -> None:
    assert decoded_vocab(Vocab(PIECES, eog_ids=[0])) is decoded_vocab(VOCAB)


def test_fresh_table() -> None:
    table = decoded_vocab(VOCAB).fresh_table()
    # valid from a fresh start: longest first, then by id; pieces starting with a continuation byte are not
    assert table.ids.tolist() == [5, 3, 4, 6]
    assert table.count_from == (3, 2, 1)
    assert [c.tolist() for c in table.columns] == [[97, 97, 0x4E2D], [98, 98], [99]]
    assert [decode_partial(p) if p else None for p in table.partials.tolist()] == [None, None, None, (4, 2)]
    assert table.row_of.tolist()[:7] == [-1, -1, -1, 1, 2, 0, 3]


def test_partial_tables() -> None:
    decoded = decoded_vocab(VOCAB)
    after_two = decoded.partial_table(2)  # what may follow b"\xe4"
    assert after_two.short_ids.tolist() == [10]
    assert after_two.long.ids.tolist() == [7, 9]  # b"\xad!": "!" cannot continue a sequence
    assert after_two.long.count_from == (2,)
    assert after_two.long_bits.tolist() == [(0x38 << 6) | 0x2D, 0]
    after_one = decoded.partial_table(1)
    assert after_one.short_ids.size == 0
    # b"\xb8\xad" and b"\x80\x80" leave a lone continuation byte after finishing the sequence: invalid
    assert after_one.long.ids.tolist() == [8, 10]
    assert after_one.long.count_from == (2, 1)


def test_encode_partial_round_trip() -> None:
    for piece in (b"\xe4", b"\xe4\xb8", b"\xf0", b"\xf0\x9f\x98", b"\xc3"):
        partial = decode_utf8(piece)[1]
        assert decode_partial(encode_partial(partial)) == partial


def test_decode_caches_fresh_starts() -> None:
    decoded = decoded_vocab(VOCAB)
    assert decoded.decode(4) is decoded.decode(4)
    assert decoded.decode(7, (4, 2)) == ((0x4E2D,), (0, 0))
