# What stack tops decide whatever lies below them, kept per vocabulary and shared by all its grammars.
#
# Contract:
# - A `TopVerdict` splits the vocabulary, for one stack top, into tokens allowed and rows left uncertain
#   (masks/cache.py builds them; their arrays are read-only once made).
# - `SharedVerdicts` keeps them by the structural ids of the top (masks/structural_ids.py), bounded in
#   bytes (and, under (LOOP_MARK, *ids), by the ids of the top with its chains made loops, each holding
#   below its `reach`), and holds the `FormTable` that numbers those ids: ids and the verdicts they key
#   live and die together, so an id is never looked up in a store that another table numbered.
# - Under (SHIFT_MARK, *ids), keyed by the ids of the stack a char terminal leaves once it matched, a
#   `ShiftedVerdict`: what that stack decides of each token's rest after its first code point. Every top
#   whose terminal leaves a stack with those ids decides alike the tokens whose first code point both
#   classes match (masks/cache.py): a key trie's `[^"a] char*`, `[^"b] char*`, ... are one walk. Its
#   flags are packed a bit a row. The keys of longer tops' shifted verdicts met once are remembered
#   (`met_before`, bounded by a count), so that only a key met again gets its verdict kept.
# - In `escapes`, by the ids of a top, an `EscapeIndex`: where the rows the top leaves uncertain met the
#   escape mark (compute.py's `escape_columns`). Equal ids match the same code points to the same ends,
#   so every top with those ids meets the mark at the same columns (masks/cache.py reads them to walk a
#   longer top over only the rows whose code point there could go on below).
# - One store per vocabulary, owned by its `DecodedVocab` (`DecodedVocab.verdicts()`): it lives as long as
#   the vocabulary is held, and every grammar compiled over that vocabulary shares it.
from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from constraintd.engine.lru import LruCache
from constraintd.engine.masks.structural_ids import UNBOUNDED, FormTable

__all__ = [
    "IDS",
    "LOOP_MARK",
    "MAX_ESCAPE_BYTES",
    "MAX_SHIFTED_BYTES",
    "MAX_SHIFT_MET",
    "MAX_VERDICT_BYTES",
    "NBYTES",
    "REACH",
    "SHIFT_MARK",
    "UNCERTAIN",
    "WORDS",
    "EscapeIndex",
    "SharedVerdicts",
    "ShiftedVerdict",
    "TopVerdict",
    "top_verdict",
]

# The first id of a key under which a verdict of a stack with its chains made loops is kept, below its
# reach (structural ids are never negative but the escape mark's, -1).
LOOP_MARK: Final = -3
# The first id of a key under which a `ShiftedVerdict` is kept.
SHIFT_MARK: Final = -4
# Default bound of one vocabulary's verdicts (shared by all its grammars), and of its shifted verdicts.
MAX_VERDICT_BYTES: Final = 192 << 20
MAX_SHIFTED_BYTES: Final = 16 << 20
# Default bound of one vocabulary's escape indexes.
MAX_ESCAPE_BYTES: Final = 32 << 20
# Keys of longer tops' shifted verdicts a vocabulary remembers having met (`SharedVerdicts.shift_met`), a
# count, and what one costs as `SharedVerdicts.nbytes` counts it: a tuple of a few ints and its entries.
MAX_SHIFT_MET: Final = 16384
_MET_KEY_BYTES: Final = 256

Words = npt.NDArray[np.int32]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


# What one stack top decides whatever lies below it: a plain tuple, read by the indexes below. A tuple of
# arrays and ints leaves the cyclic collector's sight after its first collection, where an object of a
# class of its own (a dataclass, a NamedTuple) stays in it as long as it lives, and a vocabulary keeps
# tens of thousands of verdicts (`SharedVerdicts`, MAX_VERDICT_BYTES), each walked by every full
# collection of the server. Made by `top_verdict`.
TopVerdict = tuple[Words | None, IntArray, IntArray, int, int]
# words: a packed mask of tokens allowed (possibly shared with the shorter top it was built from), or None.
WORDS: Final = 0
# ids: more allowed token ids, beyond `words` (ascending).
IDS: Final = 1
# uncertain: rows of the vocabulary's fresh table that the stacks below decide (ascending).
UNCERTAIN: Final = 2
# nbytes: bytes of the arrays this verdict holds alone (not those it shares).
NBYTES: Final = 3
# reach: the verdict holds for the tokens that look at no more terminals than this (every token, by
# default; less for the verdict of a stack whose chains are made loops, kept under a LOOP_MARK key:
# masks/structural_ids.py).
REACH: Final = 4


def top_verdict(
    words: Words | None, ids: IntArray, uncertain: IntArray, nbytes: int, reach: int = UNBOUNDED
) -> TopVerdict:
    """A `TopVerdict` of these fields."""
    return (words, ids, uncertain, nbytes, reach)


@dataclass(frozen=True, slots=True)
class ShiftedVerdict:
    """What the stack a char terminal leaves decides of the tokens' rest after their first code point.

    Its per-row flags are kept a bit a row (`np.packbits`): a vocabulary's store holds eight times as
    many verdicts in its bound, and reading one back unpacks a few tens of kilobytes.

    Attributes:
        firsts: per distinct first code point of the fresh table (`ColumnTable.first_code_points`),
            whether the rows starting with it are decided here.
        allowed_bits: per row of the fresh table that has a code point, packed: whether its rest is
            allowed (not set outside `firsts`).
        uncertain_bits: per such row, packed: whether its rest reaches the stacks below (not set outside
            `firsts`).
        rows: the rows the packed flags hold.
    """

    firsts: BoolArray
    allowed_bits: npt.NDArray[np.uint8]
    uncertain_bits: npt.NDArray[np.uint8]
    rows: int

    @classmethod
    def of(cls, firsts: BoolArray, allowed: BoolArray, uncertain: BoolArray) -> ShiftedVerdict:
        """A verdict of these flags (`allowed` and `uncertain` a flag per row), its arrays read-only."""
        packed = (np.packbits(allowed), np.packbits(uncertain))
        for array in (firsts, *packed):
            array.flags.writeable = False
        return cls(firsts, *packed, allowed.size)

    @property
    def allowed(self) -> BoolArray:
        """Per row with a code point, whether its rest is allowed (a new array)."""
        return np.unpackbits(self.allowed_bits, count=self.rows).view(np.bool_)

    @property
    def uncertain(self) -> BoolArray:
        """Per row with a code point, whether its rest reaches the stacks below (a new array)."""
        return np.unpackbits(self.uncertain_bits, count=self.rows).view(np.bool_)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays."""
        return self.firsts.nbytes + self.allowed_bits.nbytes + self.uncertain_bits.nbytes


@dataclass(frozen=True, slots=True)
class EscapeIndex:
    """Where the rows a top leaves uncertain met the escape mark, for finding those that may go on below.

    Attributes:
        rows: the top's uncertain rows (ascending), the ones indexed.
        unknown: those that met it where the column does not say (ascending).
        by_point: every other place a row met it, as the row, ordered by its code point at that column
            (a row that met it at several columns is there once for each).
        points: those code points (ascending, aligned with `by_point`).
    """

    rows: IntArray
    unknown: npt.NDArray[np.int32]
    by_point: npt.NDArray[np.int32]
    points: npt.NDArray[np.int32]

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays (`rows` included, though the top's verdict may hold it too)."""
        return self.rows.nbytes + self.unknown.nbytes + self.by_point.nbytes + self.points.nbytes


class SharedVerdicts(LruCache[tuple[int, ...], TopVerdict]):
    """One vocabulary's top verdicts, keyed by structure (see the module comment), sized in bytes.

    Attributes:
        forms: the table that numbers the structural ids keying these verdicts.
        shifted: the shifted verdicts, by (SHIFT_MARK, *ids), sized in bytes.
        shift_met: the keys of longer tops' shifted verdicts met once (`met_before`), counted.
        escapes: by the ids of a top, where the rows it leaves uncertain met the escape mark, sized in
            bytes.
    """

    __slots__ = ("escapes", "forms", "shift_met", "shifted")

    def __init__(
        self,
        *,
        max_bytes: int = MAX_VERDICT_BYTES,
        max_shifted_bytes: int = MAX_SHIFTED_BYTES,
        max_escape_bytes: int = MAX_ESCAPE_BYTES,
    ) -> None:
        super().__init__(max_bytes)
        self.forms = FormTable()
        self.shifted: LruCache[tuple[int, ...], ShiftedVerdict] = LruCache(max_shifted_bytes)
        self.shift_met: LruCache[tuple[int, ...], bool] = LruCache(MAX_SHIFT_MET)
        self.escapes: LruCache[tuple[int, ...], EscapeIndex] = LruCache(max_escape_bytes)

    def met_before(self, key: tuple[int, ...]) -> bool:
        """Whether `key` was met before (then a verdict kept under it may serve again); the first time it
        is remembered, and False."""
        if self.shift_met.get(key) is not None:
            return True
        self.shift_met.put(key, True)
        return False

    @property
    def nbytes(self) -> int:
        """Bytes of the verdicts' own arrays, shifted ones and escape columns included, and an estimate
        of the shift keys remembered."""
        return self.size + self.shifted.size + self.escapes.size + len(self.shift_met) * _MET_KEY_BYTES
