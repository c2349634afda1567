# Sets of code points as ranges: what a character class matches, for reasoning about classes without
# testing code points one by one.
#
# Contract:
# - A `Ranges` is a tuple of inclusive (low, high) pairs, sorted, disjoint and not adjacent (`merged`
#   makes one from any pairs; pairs with low > high are empty and dropped). Two equal sets have equal
#   `Ranges`, so they compare as values.
from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Ranges", "complement", "meet", "merged", "within"]

Ranges = tuple[tuple[int, int], ...]


def merged(pairs: Iterable[tuple[int, int]]) -> Ranges:
    """The code points of `pairs` (inclusive, in any order, overlapping or not) as `Ranges`."""
    out: list[tuple[int, int]] = []
    for low, high in sorted(pair for pair in pairs if pair[0] <= pair[1]):
        if out and low <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return tuple(out)


def complement(ranges: Ranges, last: int) -> Ranges:
    """The code points from 0 to `last` that `ranges` does not hold."""
    out: list[tuple[int, int]] = []
    start = 0
    for low, high in ranges:
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= last:
        out.append((start, last))
    return tuple(out)


def meet(ours: Ranges, theirs: Ranges) -> bool:
    """Whether two sets share a code point."""
    i = j = 0
    while i < len(ours) and j < len(theirs):
        if ours[i][1] < theirs[j][0]:
            i += 1
        elif theirs[j][1] < ours[i][0]:
            j += 1
        else:
            return True
    return False


def within(ours: Ranges, theirs: Ranges) -> bool:
    """Whether every code point of `ours` is in `theirs` (a range of ours lies within one of theirs, as
    theirs are not adjacent)."""
    j = 0
    for low, high in ours:
        while j < len(theirs) and theirs[j][1] < low:
            j += 1
        if j == len(theirs) or not theirs[j][0] <= low <= high <= theirs[j][1]:
            return False
    return True
