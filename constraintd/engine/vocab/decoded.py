# A vocabulary's pieces decoded as llama.cpp's grammar decodes them, laid out for whole-vocabulary masks.
#
# Contract:
# - Owned by its `Vocab` (`Vocab.decoded()` builds it on first use and holds it), shared by every grammar
#   and matcher on that vocabulary object; immutable once built (tables are built on first use, or
#   handed in prebuilt: service/vocab_store.py keeps `kinds` and the fresh table on disk). A second
#   `Vocab` with the same content has its own (the service registry keeps one `Vocab` per content).
# - What is learned per vocabulary is owned here too, built on first use: the top verdicts every grammar
#   on it shares (`verdicts()`, masks/verdicts.py, with the table numbering their structural ids) and the
#   mask allowing every token (`all_allowed()`). Each `ColumnTable` owns the index of its rows by first
#   code point (`row_groups()`), its columns as indexes into their distinct code points
#   (`dense_columns()`), and, per set of code points a grammar state loops on, where each row's run in
#   the set ends from each column (`run_ends()`, bounded in bytes). Nothing is kept in the module.
# - `kinds[token]`: END_OF_GENERATION (decided by the grammar's completeness alone), NEVER (empty piece or
#   one starting with NUL: llama.cpp never allows it) or PLAIN (decided by decoding its piece); the same
#   as bytes (`kind_of`, for one token at a time) and the END_OF_GENERATION ids (`eog_tokens`).
# - `decode(token, partial)` is `decode_utf8(piece, partial)`, cached for a fresh start.
# - `tokens_with_prefix(prefix)` / `tokens_of_piece(piece)`: the PLAIN tokens by their pieces' bytes, from
#   the pieces sorted once (built on first use, held: a reference and a machine int per token).
# - A `ColumnTable` holds the PLAIN tokens that are valid from one start state, sorted by number of code
#   points (longest first, ties by token id): column j is the j-th code point of the first
#   `count_from[j]` tokens. `fresh` is every token decoded from a fresh start; `after_partial(k)` the
#   tokens that can finish a sequence missing k bytes, whose column 0 is filled in per partial value.
from __future__ import annotations

import array as arrays
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from constraintd.engine.grammar.utf8 import FRESH, INVALID, PartialUtf8, decode_utf8
from constraintd.engine.lru import LruCache
from constraintd.engine.masks.bitmask import pack_mask
from constraintd.engine.masks.verdicts import SharedVerdicts
from constraintd.engine.vocab.vocab import Vocab

__all__ = [
    "END_OF_GENERATION",
    "MAX_RUN_END_BYTES",
    "NEVER",
    "PLAIN",
    "ColumnTable",
    "DecodedVocab",
    "PartialBounds",
    "PartialTable",
    "Ranges",
    "RowGroups",
    "encode_partial",
    "partial_bounds",
]

PLAIN: Final = 0
END_OF_GENERATION: Final = 1
NEVER: Final = 2

IntArray = npt.NDArray[np.int64]
# Code points as sorted, disjoint, inclusive ranges: the ones a state loops on (`ColumnTable.run_ends`).
Ranges = tuple[tuple[int, int], ...]
# Default bound of the run ends one table keeps (two bytes per code point of the table per set: about
# 2 MiB for a vocabulary of 150,000 pieces).
MAX_RUN_END_BYTES: Final = 16 << 20


def encode_partial(partial: PartialUtf8) -> int:
    """An unfinished sequence as one positive int (0 stands for none)."""
    return (partial[0] << 2) | partial[1] if partial[1] > 0 else 0


def decode_partial(code: int) -> PartialUtf8:
    return (code >> 2, code & 3)


@dataclass(frozen=True, slots=True)
class PartialBounds:
    """Encoded unfinished sequences (`encode_partial`, none 0) as what they could still become: the
    code points from `low` to `high`, none of them when `overlong` (a 2-byte form of a 7-bit char), as
    llama_grammar_match_partial_char reads them."""

    low: IntArray
    high: IntArray
    overlong: npt.NDArray[np.bool_]


def partial_bounds(codes: IntArray) -> PartialBounds:
    """The `PartialBounds` of many encoded sequences at once."""
    value, n_remain = codes >> 2, codes & 3
    shift = 6 * n_remain
    low = value << shift
    high = low | ((1 << shift) - 1)
    unset = low == 0
    low[unset & (n_remain == 2)] = 1 << 11
    low[unset & (n_remain == 3)] = 1 << 16
    return PartialBounds(low, high, (n_remain == 1) & (value < 2))


@dataclass(frozen=True, slots=True)
class RowGroups:
    """A `ColumnTable`'s rows grouped by first code point, for moving column 0 a group at a time.

    Attributes:
        by_value: rows with a code point, by the index of their first one (stable).
        group_starts: where each first code point's rows start in `by_value` (one more at the end).
        bare_rows: rows without a code point (a lone unfinished sequence).
        bare_codes: their distinct encoded sequences.
        bare_inverse: per bare row, the index of its sequence in `bare_codes`.
        bare_bounds: what `bare_codes` could still become (every whole walk judges them).
    """

    by_value: IntArray
    group_starts: IntArray
    bare_rows: IntArray
    bare_codes: IntArray
    bare_inverse: IntArray
    bare_bounds: PartialBounds


@dataclass(frozen=True, slots=True)
class ColumnTable:
    """Tokens by code points, column-major (see the module comment).

    Attributes:
        ids: token id at each row.
        columns: columns[j][row] is the j-th code point of the rows that have one (rows < count_from[j]).
        count_from: rows with more than j code points, per j (non-increasing).
        partials: per row, `encode_partial` of the sequence the piece leaves unfinished (0: none).
        row_of: per token id, its row, or -1 when the token is not in the table.
        first_code_points / first_index: column 0 as its distinct values (ascending) and, per row, the
            index of its value there (all rows start from one state: column 0 moves once per value).
    """

    ids: IntArray
    columns: tuple[IntArray, ...]
    count_from: tuple[int, ...]
    partials: IntArray
    row_of: IntArray
    first_code_points: IntArray
    first_index: IntArray
    # derived from the fields above on first use (`row_groups`, `dense_columns`), so not part of the value
    _groups: RowGroups | None = field(default=None, init=False, repr=False, compare=False)
    _dense: tuple[IntArray, tuple[npt.NDArray[np.int32], ...]] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    _run_ends: LruCache[Ranges, tuple[npt.NDArray[np.integer], ...]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def run_end_bytes(self) -> int:
        """Bytes of the run ends kept (`run_ends`)."""
        kept = self._run_ends
        return 0 if kept is None else kept.size

    @property
    def code_points(self) -> int:
        """The code points of all rows: what counting a set's run ends reads."""
        return sum(self.count_from)

    def run_ends(self, ranges: Ranges, *, build: bool = True) -> tuple[npt.NDArray[np.integer], ...] | None:
        """Per column j, for each row with a code point there (rows < count_from[j]): the first column
        from j on whose code point `ranges` does not hold, or the row's length where it holds all of them.
        A state that moves every code point of `ranges` back to itself keeps a row there up to that column
        (masks/compute.py's `walk`). Counted on first use (None instead when `build` is False), then kept
        by the table (read-only), the least recently used set dropped past MAX_RUN_END_BYTES."""
        kept = self._run_ends
        if kept is None:
            kept = LruCache(MAX_RUN_END_BYTES)
            object.__setattr__(self, "_run_ends", kept)  # as `row_groups`: a derived index
        ends = kept.get(ranges)
        if ends is None:
            if not build:
                return None
            ends = self._count_run_ends(ranges)
            kept.put(ranges, ends, sum(column.nbytes for column in ends))
        return ends

    def _count_run_ends(self, ranges: Ranges) -> tuple[npt.NDArray[np.integer], ...]:
        # from the last column back: a row's end at j is j where its code point is not held, else its end
        # at j + 1 (j + 1 itself for the rows whose last code point is at j)
        distinct, indexes = self.dense_columns()
        held = np.zeros(distinct.size, dtype=np.bool_)
        for low, high in ranges:
            first = int(np.searchsorted(distinct, low, side="left"))
            held[first : int(np.searchsorted(distinct, high, side="right"))] = True
        count_from = self.count_from
        short = len(count_from) < np.iinfo(np.uint16).max  # no row of 65,535 code points: two bytes each
        ends: list[npt.NDArray[np.integer]] = []
        after: npt.NDArray[np.integer] = np.zeros(0, dtype=np.uint16)
        for j in range(len(count_from) - 1, -1, -1):
            here: npt.NDArray[np.integer] = (
                np.full(count_from[j], j + 1, dtype=np.uint16) if short else np.full(count_from[j], j + 1)
            )
            here[: after.size] = after
            here[~held[indexes[j]]] = j
            here.flags.writeable = False
            ends.append(here)
            after = here
        return tuple(reversed(ends))

    def dense_columns(self) -> tuple[IntArray, tuple[npt.NDArray[np.int32], ...]]:
        """The distinct code points of every column (ascending) and each column as indexes into them
        (built on first use, then held by the table): a state's intervals become a table over the few
        distinct code points, read by index, instead of a search per row."""
        dense = self._dense
        if dense is None:
            values = np.sort(np.concatenate(self.columns)) if self.columns else np.zeros(0, dtype=np.int64)
            keep = np.ones(values.size, dtype=np.bool_)
            np.not_equal(values[1:], values[:-1], out=keep[1:])
            distinct = values[keep]
            indexes = tuple(np.searchsorted(distinct, column).astype(np.int32) for column in self.columns)
            distinct.flags.writeable = False
            for index in indexes:
                index.flags.writeable = False
            dense = (distinct, indexes)
            object.__setattr__(self, "_dense", dense)  # as `row_groups`: a derived index
        return dense

    def row_groups(self) -> RowGroups:
        """The rows grouped by first code point (built on first use, then held by the table)."""
        groups = self._groups
        if groups is None:
            counts = np.bincount(self.first_index, minlength=self.first_code_points.size)
            group_starts = np.zeros(counts.size + 1, dtype=np.int64)
            np.cumsum(counts, out=group_starts[1:])
            bare_rows = np.arange(self.count_from[0] if self.count_from else 0, self.ids.size, dtype=np.int64)
            bare_codes, bare_inverse = np.unique(self.partials[bare_rows], return_inverse=True)
            groups = RowGroups(
                by_value=np.argsort(self.first_index, kind="stable").astype(np.int64),
                group_starts=group_starts,
                bare_rows=bare_rows,
                bare_codes=bare_codes,
                bare_inverse=bare_inverse.reshape(-1),
                bare_bounds=partial_bounds(bare_codes),
            )
            # the value is frozen, its derived index is not: the one write this class makes
            object.__setattr__(self, "_groups", groups)
        return groups


@dataclass(frozen=True, slots=True)
class PartialTable:
    """The tokens that can follow a piece that left a sequence missing `k` bytes.

    Attributes:
        short_ids / short_lengths / short_bits: tokens of fewer than k bytes, all continuation bytes: the
            sequence is still unfinished after them; their byte count and the bits they add.
        long: tokens of at least k bytes starting with k continuation bytes, then valid UTF-8; their rows
            hold the code points after the k bytes, from column 1 on (column 0 is a placeholder).
        long_bits: per row of `long`, the bits its first k bytes add to the unfinished sequence.
    """

    k: int
    short_ids: IntArray
    short_lengths: IntArray
    short_bits: IntArray
    long: ColumnTable
    long_bits: IntArray


class DecodedVocab:
    """The pieces of one vocabulary as the grammar decodes them (see the module comment)."""

    __slots__ = (
        "_all_allowed",
        "_by_piece",
        "_fresh",
        "_fresh_table",
        "_partial_tables",
        "_verdicts",
        "eog_tokens",
        "has_never",
        "kind_of",
        "kinds",
        "n_tokens",
        "pieces",
    )

    def __init__(
        self,
        vocab: Vocab,
        *,
        kinds: npt.NDArray[np.int8] | None = None,
        fresh_table: ColumnTable | None = None,
    ) -> None:
        """`kinds` and `fresh_table`, when given, are this vocabulary's as built before (the vocabulary store
        reads them from disk); they are taken as they are, read-only, not checked."""
        self.pieces = vocab.pieces
        self.n_tokens = len(vocab)
        if kinds is None:
            kinds = np.full(self.n_tokens, PLAIN, dtype=np.int8)
            kinds[[i for i, p in enumerate(self.pieces) if not p or p[0] == 0]] = NEVER
            kinds[sorted(vocab.eog_ids)] = END_OF_GENERATION
        kinds.flags.writeable = False
        self.kinds: npt.NDArray[np.int8] = kinds
        # the same, for one token at a time: indexing bytes gives a Python int without touching numpy
        self.kind_of: bytes = kinds.astype(np.uint8).tobytes()
        self.eog_tokens: IntArray = np.flatnonzero(kinds == END_OF_GENERATION)  # ascending
        self.has_never: bool = bool((kinds == NEVER).any())  # so no mask allows every token
        self._fresh: dict[int, tuple[tuple[int, ...], PartialUtf8]] = {}
        self._fresh_table: ColumnTable | None = fresh_table
        self._partial_tables: dict[int, PartialTable] = {}
        self._verdicts: SharedVerdicts | None = None
        self._all_allowed: npt.NDArray[np.int32] | None = None
        self._by_piece: tuple[list[bytes], arrays.array[int]] | None = None

    def verdicts(self) -> SharedVerdicts:
        """The top verdicts every grammar on this vocabulary shares (masks/verdicts.py), made on first use."""
        verdicts = self._verdicts
        if verdicts is None:
            verdicts = self._verdicts = SharedVerdicts()
        return verdicts

    def all_allowed(self) -> npt.NDArray[np.int32]:
        """The packed mask allowing every token (read-only), made on first use."""
        mask = self._all_allowed
        if mask is None:
            mask = pack_mask(np.ones(self.n_tokens, dtype=np.bool_))
            mask.flags.writeable = False
            self._all_allowed = mask
        return mask

    def decode(self, token: int, partial: PartialUtf8 = FRESH) -> tuple[tuple[int, ...], PartialUtf8]:
        """`decode_utf8(piece, partial)` of a token (cached for a fresh start)."""
        if partial[1] > 0:
            return decode_utf8(self.pieces[token], partial)
        decoded = self._fresh.get(token)
        if decoded is None:  # a token's first decode (no exception made: this is an accept's first visit)
            decoded = self._fresh[token] = decode_utf8(self.pieces[token])
        return decoded

    def tokens_with_prefix(self, prefix: bytes) -> arrays.array[int]:
        """The PLAIN tokens whose piece starts with `prefix` (the piece itself included), in the order of
        their pieces (from `piece_index`)."""
        pieces, tokens = self.piece_index()
        begin = bisect_left(pieces, prefix)
        after = prefix.rstrip(b"\xff")  # the least bytes above every piece that starts with `prefix`
        end = bisect_left(pieces, after[:-1] + bytes((after[-1] + 1,)), begin) if after else len(pieces)
        return tokens[begin:end]

    def tokens_of_piece(self, piece: bytes) -> arrays.array[int]:
        """The PLAIN tokens whose piece is `piece` (usually one, or none), from `piece_index`."""
        pieces, tokens = self.piece_index()
        begin = bisect_left(pieces, piece)
        return tokens[begin : bisect_right(pieces, piece, begin)]

    def piece_index(self) -> tuple[list[bytes], arrays.array[int]]:
        """The pieces of the PLAIN tokens, sorted, and those tokens in that order (ties by id). Built on
        first use (a sort: about 50 ms for 150,000 pieces), then held (12 bytes a token: a reference to
        the piece, and the token as a machine int); a caller with a time budget to keep builds it first."""
        index = self._by_piece
        if index is None:
            pieces = self.pieces
            order = sorted(np.flatnonzero(self.kinds == PLAIN).tolist(), key=pieces.__getitem__)
            index = self._by_piece = ([pieces[token] for token in order], arrays.array("i", order))
        return index

    def fresh_table(self) -> ColumnTable:
        """Every PLAIN token valid from a fresh start."""
        if self._fresh_table is None:
            # Well-formed UTF-8 without NUL (nearly every piece) is decoded by Python, all at once as
            # UTF-32; the rest by llama.cpp's decoder.
            texts: list[str] = []
            text_ids: list[int] = []
            rows: list[tuple[int, tuple[int, ...], int]] = []
            for token in np.flatnonzero(self.kinds == PLAIN).tolist():
                piece = self.pieces[token]
                if 0 not in piece:
                    try:
                        texts.append(piece.decode("utf-8"))
                    except UnicodeDecodeError:
                        pass
                    else:
                        text_ids.append(token)
                        continue
                code_points, partial = decode_utf8(piece)
                if partial != INVALID:
                    rows.append((token, code_points, encode_partial(partial)))
            fast = np.frombuffer("".join(texts).encode("utf-32-le"), dtype="<u4").astype(np.int64)
            slow = np.fromiter((cp for row in rows for cp in row[1]), dtype=np.int64)
            self._fresh_table = _column_table(
                ids=np.array(text_ids + [row[0] for row in rows], dtype=np.int64),
                flat=np.concatenate((fast, slow)),
                lengths=np.array([len(t) for t in texts] + [len(row[1]) for row in rows], dtype=np.int64),
                partials=np.array([0] * len(texts) + [row[2] for row in rows], dtype=np.int64),
                n_tokens=self.n_tokens,
            )
        return self._fresh_table

    def partial_table(self, k: int) -> PartialTable:
        """The tokens that can finish a sequence missing `k` bytes (1 to 3)."""
        table = self._partial_tables.get(k)
        if table is None:
            table = self._partial_tables[k] = self._build_partial_table(k)
        return table

    def _build_partial_table(self, k: int) -> PartialTable:
        short: list[tuple[int, int, int]] = []
        long: list[tuple[int, tuple[int, ...], int]] = []
        long_bits: dict[int, int] = {}
        for token in np.flatnonzero(self.kinds == PLAIN).tolist():
            piece = self.pieces[token]
            if piece[0] >> 6 != 2:
                continue  # not a continuation byte: invalid after a partial sequence
            nul = piece.find(0)
            if nul >= 0:
                piece = piece[:nul]
            head = piece[:k]
            if any(byte >> 6 != 2 for byte in head):
                continue
            bits = 0
            for byte in head:
                bits = (bits << 6) | (byte & 0x3F)
            if len(piece) < k:
                short.append((token, len(piece), bits))
                continue
            code_points, partial = decode_utf8(piece[k:])
            if partial == INVALID:
                continue
            long.append((token, (0, *code_points), encode_partial(partial)))
            long_bits[token] = bits
        table = _rows_table(long, self.n_tokens)
        return PartialTable(
            k=k,
            short_ids=np.array([s[0] for s in short], dtype=np.int64),
            short_lengths=np.array([s[1] for s in short], dtype=np.int64),
            short_bits=np.array([s[2] for s in short], dtype=np.int64),
            long=table,
            long_bits=np.array([long_bits[t] for t in table.ids.tolist()], dtype=np.int64),
        )


def _rows_table(rows: list[tuple[int, tuple[int, ...], int]], n_tokens: int) -> ColumnTable:
    return _column_table(
        ids=np.array([row[0] for row in rows], dtype=np.int64),
        flat=np.fromiter((cp for row in rows for cp in row[1]), dtype=np.int64),
        lengths=np.array([len(row[1]) for row in rows], dtype=np.int64),
        partials=np.array([row[2] for row in rows], dtype=np.int64),
        n_tokens=n_tokens,
    )


def _column_table(
    *, ids: IntArray, flat: IntArray, lengths: IntArray, partials: IntArray, n_tokens: int
) -> ColumnTable:
    # rows' code points are consecutive in `flat`, in row order
    starts = np.zeros(ids.size, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    order = np.lexsort((ids, -lengths))  # longest first, then by id
    ids, starts, lengths, partials = ids[order], starts[order], lengths[order], partials[order]
    longest = int(lengths[0]) if ids.size else 0
    count_from = tuple(int(np.count_nonzero(lengths > j)) for j in range(longest))
    row_of = np.full(n_tokens, -1, dtype=np.int64)
    row_of[ids] = np.arange(ids.size, dtype=np.int64)
    columns = tuple(flat[starts[:count] + j] for j, count in enumerate(count_from))
    first_code_points, first_index = np.unique(
        columns[0] if columns else np.zeros(0, dtype=np.int64), return_inverse=True
    )
    table = ColumnTable(
        ids=ids,
        columns=columns,
        count_from=count_from,
        partials=partials,
        row_of=row_of,
        first_code_points=first_code_points,
        first_index=first_index.reshape(-1),
    )
    for array in (
        table.ids,
        table.partials,
        table.row_of,
        table.first_code_points,
        table.first_index,
        *columns,
    ):
        array.flags.writeable = False
    return table
