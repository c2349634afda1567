"""The decoded vocabulary: token kinds, and the column tables the mask walks."""

from __future__ import annotations

from constraintd.engine.grammar.utf8 import decode_utf8
from constraintd.engine.vocab.decoded import (
    END_OF_GENERATION,
    NEVER,
    PLAIN,
    DecodedVocab,
    decode_partial,
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
    kinds = VOCAB.decoded().kinds.tolist()
    assert kinds[:4] == [END_OF_GENERATION, NEVER, NEVER, PLAIN]
    assert set(kinds[3:]) == {PLAIN}


def test_held_by_its_vocabulary() -> None:
    # one per Vocab object, with what it learns (verdicts, the all-allowed mask): a second object with the
    # same content starts without them (the registry keeps one object per content)
    decoded = VOCAB.decoded()
    assert VOCAB.decoded() is decoded and decoded.verdicts() is decoded.verdicts()
    assert decoded.all_allowed() is decoded.all_allowed()
    twin = Vocab(PIECES, eog_ids=[0])
    assert twin.decoded() is not decoded and twin.decoded().verdicts() is not decoded.verdicts()
    assert twin.decoded().kinds.tolist() == decoded.kinds.tolist()


def test_prebuilt_tables_are_held_only_when_none_are() -> None:
    vocab = Vocab(PIECES, eog_ids=[0])
    prebuilt = DecodedVocab(vocab)
    assert vocab.decoded(prebuilt=prebuilt) is prebuilt
    assert vocab.decoded(prebuilt=DecodedVocab(vocab)) is prebuilt


def test_the_all_allowed_mask_allows_every_token_and_nothing_past_them() -> None:
    mask = VOCAB.decoded().all_allowed()
    assert not mask.flags.writeable
    assert mask.tolist() == [(1 << len(PIECES)) - 1]


def test_a_table_holds_its_row_groups() -> None:
    table = VOCAB.decoded().fresh_table()
    groups = table.row_groups()
    assert table.row_groups() is groups
    # rows 0-2 start with "a", "a", "中"; row 3 (b"\xe4") has no code point
    assert groups.by_value.tolist() == [0, 1, 2]
    assert groups.group_starts.tolist() == [0, 2, 3]
    assert groups.bare_rows.tolist() == [3]


def test_fresh_table() -> None:
    table = VOCAB.decoded().fresh_table()
    # valid from a fresh start: longest first, then by id; pieces starting with a continuation byte are not
    assert table.ids.tolist() == [5, 3, 4, 6]
    assert table.count_from == (3, 2, 1)
    assert [c.tolist() for c in table.columns] == [[97, 97, 0x4E2D], [98, 98], [99]]
    assert [decode_partial(p) if p else None for p in table.partials.tolist()] == [None, None, None, (4, 2)]
    assert table.row_of.tolist()[:7] == [-1, -1, -1, 1, 2, 0, 3]


def test_partial_tables() -> None:
    decoded = VOCAB.decoded()
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
    decoded = VOCAB.decoded()
    assert decoded.decode(4) is decoded.decode(4)
    assert decoded.decode(7, (4, 2)) == ((0x4E2D,), (0, 0))


def test_tokens_by_their_pieces_bytes_are_those_a_scan_finds() -> None:
    pieces = [b"</s>", b"", b"\x00a", b"a", b"ab", b"abc", b"ab", b"b", b"\xff", b"\xff\xff", b"\xffa"]
    pieces += [b"a\xff", b"\xc3", "é".encode(), b"\xc3\xa9x"]
    decoded = Vocab(pieces, eog_ids=[0]).decoded()
    plain = [token for token in range(len(pieces)) if decoded.kinds[token] == PLAIN]
    for prefix in (b"a", b"ab", b"abc", b"abcd", b"\xff", b"\xff\xff", b"\xc3", b"", b"<", b"b"):
        found = decoded.tokens_with_prefix(prefix)
        assert sorted(found) == [t for t in plain if pieces[t].startswith(prefix)], prefix
        assert [pieces[t] for t in found] == sorted(pieces[t] for t in found)  # in the order of pieces
        assert list(decoded.tokens_of_piece(prefix)) == [t for t in plain if pieces[t] == prefix], prefix
