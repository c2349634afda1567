# The order llama.cpp's sorts leave candidates in, ties included.
#
# llama.cpp sorts candidates with libstdc++'s `std::partial_sort` (heap select + heap sort),
# `std::sort` (introsort: median-of-three quicksort, heap sort past a depth limit, insertion sort
# to finish) and, for more than 128 candidates, its own bucket sort over 128 logit buckets
# (`llama_token_data_array_partial_sort`). None of them is stable: among candidates with equal
# logits, the order that comes out depends on every move the algorithm made. That order decides
# which of several tied tokens survives a top-k cut and where each sits in the cumulative sum the
# `dist` sampler walks, so a sampler that must draw the same token as llama.cpp has to reproduce it.
#
# Contract: every function returns positions into its input, in the order the C++ algorithm leaves
# the elements (for a partial sort: the first `m` only). Keys are compared with `<` on Python floats
# made from float32 values (exact); to sort by "greater logit first" as llama.cpp's comparator
# `a.logit > b.logit` does, pass negated logits (negation is exact, so `-a < -b` iff `a > b`).
#
# Speed: when the keys involved are all distinct, every correct sort gives the same order, so numpy
# answers; only when ties (or NaN) are present do we run the ported algorithm, in Python, on the
# elements that can matter (a heap select only looks at elements that beat the current heap top,
# which we find a block at a time with numpy, and never at +inf keys past its first `middle`). A
# partial sort of few keys without NaN is kept by the keys' order type (their dense ranks), which is
# all the algorithm reads: a masked redraw's ties recur with every logit, and cost a lookup.

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = ["bucket_partial_order", "bucket_value_order", "largest_unique", "partial_sort_order", "sort_order"]

Positions = npt.NDArray[np.intp]
Keys = npt.NDArray[np.float32] | npt.NDArray[np.float64]
Item = tuple[float, int]  # (key, position in the input)

_INSERTION_THRESHOLD = 16  # libstdc++'s _S_threshold
_SCAN_BLOCK = 4096
_GROUPED = 64  # `_pool_of_largest`: elements per group
# `partial_sort_order` on at most this many keys answers from the order of their dense ranks, kept for the
# last _MEMO_ENTRIES order types (a few hundred bytes each: at most a few MiB)
_MEMO_MAX_KEYS = 512
_MEMO_ENTRIES = 4096


# --- libstdc++'s heap algorithms (bits/stl_heap.h), on a list of items, comparator `<` on keys ---

def _push_heap(a: list[Item], first: int, hole: int, top: int, value: Item) -> None:
    while hole > top:
        parent = (hole - 1) // 2
        if not a[first + parent][0] < value[0]:
            break
        a[first + hole] = a[first + parent]
        hole = parent
    a[first + hole] = value


def _adjust_heap(a: list[Item], first: int, hole: int, length: int, value: Item) -> None:
    top = hole
    child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if a[first + child][0] < a[first + child - 1][0]:
            child -= 1
        a[first + hole] = a[first + child]
        hole = child
    if length % 2 == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        a[first + hole] = a[first + child - 1]
        hole = child - 1
    _push_heap(a, first, hole, top, value)


def _pop_heap(a: list[Item], first: int, last: int, result: int) -> None:
    value = a[result]
    a[result] = a[first]
    _adjust_heap(a, first, 0, last - first, value)


def _make_heap(a: list[Item], first: int, last: int) -> None:
    length = last - first
    if length < 2:
        return
    parent = (length - 2) // 2
    while True:
        _adjust_heap(a, first, parent, length, a[first + parent])
        if parent == 0:
            return
        parent -= 1


def _sort_heap(a: list[Item], first: int, last: int) -> None:
    while last - first > 1:
        last -= 1
        _pop_heap(a, first, last, last)


def _heap_sort(a: list[Item], first: int, last: int) -> None:
    # std::partial_sort(first, last, last): the heap select has nothing to scan.
    _make_heap(a, first, last)
    _sort_heap(a, first, last)


# --- libstdc++'s introsort (bits/stl_algo.h) ---

def _unguarded_linear_insert(a: list[Item], last: int) -> None:
    value = a[last]
    previous = last - 1
    while value[0] < a[previous][0]:
        a[last] = a[previous]
        last = previous
        previous -= 1
    a[last] = value


def _insertion_sort(a: list[Item], first: int, last: int) -> None:
    if first == last:
        return
    for i in range(first + 1, last):
        if a[i][0] < a[first][0]:
            value = a[i]
            a[first + 1 : i + 1] = a[first:i]
            a[first] = value
        else:
            _unguarded_linear_insert(a, i)


def _final_insertion_sort(a: list[Item], first: int, last: int) -> None:
    if last - first > _INSERTION_THRESHOLD:
        _insertion_sort(a, first, first + _INSERTION_THRESHOLD)
        for i in range(first + _INSERTION_THRESHOLD, last):
            _unguarded_linear_insert(a, i)
    else:
        _insertion_sort(a, first, last)


def _move_median_to_first(a: list[Item], result: int, x: int, y: int, z: int) -> None:
    kx, ky, kz = a[x][0], a[y][0], a[z][0]
    if kx < ky:
        if ky < kz:
            median = y
        elif kx < kz:
            median = z
        else:
            median = x
    elif kx < kz:
        median = x
    elif ky < kz:
        median = z
    else:
        median = y
    a[result], a[median] = a[median], a[result]


def _unguarded_partition(a: list[Item], first: int, last: int, pivot: int) -> int:
    key = a[pivot][0]  # the pivot stays put: the range partitioned starts after it
    while True:
        while a[first][0] < key:
            first += 1
        last -= 1
        while key < a[last][0]:
            last -= 1
        if not first < last:
            return first
        a[first], a[last] = a[last], a[first]
        first += 1


def _introsort_loop(a: list[Item], first: int, last: int, depth_limit: int) -> None:
    while last - first > _INSERTION_THRESHOLD:
        if depth_limit == 0:
            _heap_sort(a, first, last)
            return
        depth_limit -= 1
        middle = first + (last - first) // 2
        _move_median_to_first(a, first, first + 1, middle, last - 1)
        cut = _unguarded_partition(a, first + 1, last, first)
        _introsort_loop(a, cut, last, depth_limit)
        last = cut


# --- the same introsort with the partition vectorised, for long runs of ties ---
#
# libstdc++'s unguarded partition scans i up from first+1 to the next key not below the pivot and j
# down from last to the next key not above it, and swaps, until they cross. Before they cross, every
# stop is one the original keys determine: the k-th stop of i is the k-th position (ascending) whose
# key is not below the pivot, the k-th stop of j the k-th position (descending) whose key is not
# above it, and the k-th pair is swapped while the first is left of the second. At the first k where
# it is not, the partition returns i's k-th stop, or j's previous stop if that comes first (the
# swapped-in key there stops i). Those are numpy operations over the whole segment.

_VECTOR_PARTITION_ABOVE = 256


def _partition_np(keys: npt.NDArray[np.float64], items: npt.NDArray[np.intp], first: int, last: int) -> int:
    pivot = keys[first]
    segment = keys[first + 1 : last]
    with np.errstate(invalid="ignore"):
        left = np.flatnonzero(~(segment < pivot)) + first + 1
        right = np.flatnonzero(~(pivot < segment))[::-1] + first + 1
    pairs = min(left.size, right.size)
    crossed = np.flatnonzero(left[:pairs] >= right[:pairs])
    stop = int(crossed[0]) if crossed.size else pairs
    swap_left, swap_right = left[:stop], right[:stop]
    keys[swap_left], keys[swap_right] = keys[swap_right], keys[swap_left].copy()
    items[swap_left], items[swap_right] = items[swap_right], items[swap_left].copy()
    cut = int(left[stop]) if stop < left.size else last
    if stop > 0:
        cut = min(cut, int(right[stop - 1]))
    return cut


def _median_to_first_np(
    keys: npt.NDArray[np.float64], items: npt.NDArray[np.intp], first: int, last: int
) -> None:
    trio = [first + 1, first + (last - first) // 2, last - 1]
    a: list[Item] = [(float(keys[p]), int(items[p])) for p in [first, *trio]]
    _move_median_to_first(a, 0, 1, 2, 3)
    for slot, p in enumerate([first, *trio]):
        keys[p], items[p] = a[slot]


def _introsort_loop_np(
    keys: npt.NDArray[np.float64], items: npt.NDArray[np.intp], first: int, last: int, depth_limit: int
) -> None:
    while last - first > _VECTOR_PARTITION_ABOVE:
        if depth_limit == 0:
            _in_python(keys, items, first, last, lambda a: _heap_sort(a, 0, len(a)))
            return
        depth_limit -= 1
        _median_to_first_np(keys, items, first, last)
        cut = _partition_np(keys, items, first, last)
        _introsort_loop_np(keys, items, cut, last, depth_limit)
        last = cut
    _in_python(keys, items, first, last, lambda a: _introsort_loop(a, 0, len(a), depth_limit))


def _in_python(keys: npt.NDArray[np.float64], items: npt.NDArray[np.intp], first: int, last: int,
               work: Callable[[list[Item]], None]) -> None:
    a = list(zip(keys[first:last].tolist(), items[first:last].tolist(), strict=True))
    work(a)
    keys[first:last] = [key for key, _ in a]
    items[first:last] = [item for _, item in a]


# --- what callers use ---

def _unique_prefix(keys: Keys, count: int) -> Positions | None:
    # The positions of the `count` smallest keys in order, when every correct sort agrees on them:
    # no NaN, those keys distinct, and (unless they are all the keys) strictly below the rest.
    if np.isnan(keys).any():
        return None
    if count >= keys.size:
        ordered = np.argsort(keys, kind="stable").astype(np.intp, copy=False)
        chosen = keys[ordered]
        return None if np.any(chosen[1:] == chosen[:-1]) else ordered
    return largest_unique(-keys, count)  # the smallest keys are the largest of their negations


def largest_unique(values: Keys, count: int) -> Positions | None:
    """The positions of the `count` largest values, largest first, when every correct sort agrees on
    them (those values distinct and strictly above the rest); None otherwise.

    A sampler chain's first draw asks it of every logit of the vocabulary, which it does not copy.
    `values` holds no NaN (the caller has checked) and more than `count` elements, `count` > 0.
    """
    pool = _pool_of_largest(values, count + 1)
    keys = -values[pool]  # the pool only: a few hundred where the whole holds hundreds of thousands
    head = pool[np.argpartition(keys, count)[: count + 1]]
    head = head[np.argsort(-values[head], kind="stable")]
    chosen = values[head]
    if chosen[count - 1] > chosen[count] and not np.any(chosen[1:count] == chosen[: count - 1]):
        return head[:count].astype(np.intp, copy=False)
    return None


def _pool_of_largest(values: Keys, count: int) -> Positions:
    # Positions of a subset that surely holds the `count` largest values: the elements fall into n groups
    # of _GROUPED (group j: positions j, j + n, j + 2n, ...; the last size % _GROUPED positions join the
    # pool whole), and the count-th largest group maximum is a bound: `count` elements reach it, so the
    # `count` largest all do, and only groups whose maximum reaches it hold any. One strided maximum over
    # the array, then work on about `count` groups: no pass that lists positions of the whole.
    n = values.size // _GROUPED
    if n < 2 * count:
        return np.arange(values.size, dtype=np.intp)
    maxima = values[: n * _GROUPED].reshape(_GROUPED, n).max(axis=0)
    bound = np.partition(maxima, n - count)[n - count]
    groups = np.flatnonzero(maxima >= bound)
    pool = (groups[None, :] + np.arange(0, n * _GROUPED, n)[:, None]).ravel()
    if n * _GROUPED < values.size:
        pool = np.concatenate((pool, np.arange(n * _GROUPED, values.size)))
    kept: Positions = pool[values[pool] >= bound]
    return kept


def sort_order(keys: Keys, *, needed: int | None = None) -> Positions:
    """The order `std::sort(first, last, comp)` leaves the elements in, `comp` being `<` on keys.

    Args:
        keys: one key per element, in the input order.
        needed: if given, only the first `needed` positions are returned (and computed exactly).

    Returns:
        Positions into `keys`, first to last.
    """
    wanted = keys.size if needed is None else min(needed, keys.size)
    if wanted == 0:
        return np.empty(0, dtype=np.intp)
    fast = _unique_prefix(keys, wanted)
    if fast is not None:
        return fast
    wide = keys.astype(np.float64)
    positions = np.arange(keys.size, dtype=np.intp)
    _introsort_loop_np(wide, positions, 0, keys.size, 2 * (keys.size.bit_length() - 1))
    if not np.isnan(wide).any():
        # The final insertion sort, with a strict `<`, never moves an element past an equal one: it is a
        # stable sort of what the quicksort passes left, which numpy's stable sort computes at C speed.
        # (With NaN the comparisons are no order at all, so then the insertion sort itself runs.)
        return positions[np.argsort(wide, kind="stable")][:wanted]
    items = list(zip(wide.tolist(), positions.tolist(), strict=True))
    _final_insertion_sort(items, 0, len(items))
    return np.fromiter((position for _, position in items[:wanted]), dtype=np.intp, count=wanted)


def partial_sort_order(keys: Keys, middle: int, *, needed: int | None = None) -> Positions:
    """The first `middle` elements `std::partial_sort(first, first + middle, last, comp)` leaves.

    Args:
        keys: one key per element, in the input order; `comp` is `<` on keys.
        middle: how many elements come out sorted (0 < middle <= len(keys)).
        needed: if given, only the first `needed` (<= middle) positions are returned.

    Returns:
        The first `needed` (default `middle`) positions into `keys`, first to last.
    """
    middle = min(middle, keys.size)
    wanted = middle if needed is None else min(needed, middle)
    if wanted == 0:
        return np.empty(0, dtype=np.intp)
    if middle < keys.size:
        # std::__heap_select lets an element past `middle` into the heap only if it compares below
        # the heap top; a +inf (or NaN) key never does, so leaving those elements out changes
        # nothing. A grammar mask makes most logits -inf (keys +inf): the sort then sees the few left.
        # (Counted first: most calls have no such key, and listing every position would cost more than
        # the sort.)
        finite = keys[middle:] < np.inf
        if np.count_nonzero(finite) < (keys.size - middle) // 2:
            later = np.flatnonzero(finite)
            subset = np.concatenate((np.arange(middle, dtype=np.intp), later + middle))
            return subset[partial_sort_order(keys[subset], middle, needed=needed)]
    fast = _unique_prefix(keys, wanted)
    if fast is not None:
        return fast
    if middle >= keys.size:
        items = list(zip(keys.astype(np.float64).tolist(), range(keys.size), strict=True))
        _heap_sort(items, 0, keys.size)
        return np.fromiter((position for _, position in items[:wanted]), dtype=np.intp, count=wanted)
    if keys.size <= _MEMO_MAX_KEYS and not np.isnan(keys).any():
        _, ranks = np.unique(keys, return_inverse=True)
        order = _heap_order_of_ranks(tuple(ranks.reshape(-1).tolist()), middle)
        return np.array(order[:wanted], dtype=np.intp)
    return _heap_select_and_sort(keys, middle)[:wanted]


@functools.lru_cache(maxsize=_MEMO_ENTRIES)
def _heap_order_of_ranks(ranks: tuple[int, ...], middle: int) -> tuple[int, ...]:
    # The heap select and sort only ever ask `a < b`, so what they leave depends on the keys' order
    # type alone: keys replaced by their dense ranks (ties kept equal) come out in the same order.
    # A masked redraw's keys are the first k tokens' (mostly rejected, +inf, all tied) and a few
    # allowed past them: one order type recurs with every logit, and its order is looked up here.
    return tuple(_heap_select_and_sort(np.array(ranks, dtype=np.float64), middle).tolist())


def _heap_select_and_sort(keys: Keys, middle: int) -> Positions:
    wide = keys.astype(np.float64)
    heap: list[Item] = list(zip(wide[:middle].tolist(), range(middle), strict=True))
    _make_heap(heap, 0, middle)
    # std::__heap_select: each later element that beats the heap top (the worst kept) replaces it.
    # The top only gets better, so an element that fails against the top at the start of a block
    # fails at its turn too: numpy finds the few that might pass, Python replays them in order.
    slot: list[Item] = [(0.0, 0)]
    heap.append(slot[0])
    for start in range(middle, keys.size, _SCAN_BLOCK):
        block = wide[start : start + _SCAN_BLOCK]
        for offset in np.flatnonzero(block < heap[0][0]).tolist():
            key = float(block[offset])
            if key < heap[0][0]:
                heap[middle] = (key, start + offset)
                _pop_heap(heap, 0, middle, middle)
    del heap[middle]
    _sort_heap(heap, 0, middle)
    return np.fromiter((position for _, position in heap), dtype=np.intp, count=middle)


# llama.cpp's buckets: 128 of them over logits [-10, 10), scale and offset computed in float.
_N_BUCKETS = 128
_BUCKET_SCALE = np.float32(_N_BUCKETS / (10.0 - -10.0))
_BUCKET_INTERCEPT = np.float32(10.0) * _BUCKET_SCALE
_INT_MIN = -(2**31)


def _bucket_of(logits: npt.NDArray[np.float32]) -> npt.NDArray[np.intp]:
    with np.errstate(all="ignore"):
        scaled = _BUCKET_SCALE * logits + _BUCKET_INTERCEPT
        # int(float) truncates; out of int range (or NaN) the x86 conversion yields INT_MIN.
        in_range = (scaled > -(2.0**31)) & (scaled < 2.0**31)
        truncated = np.trunc(np.where(in_range, scaled, 0.0)).astype(np.int64)
    bucket = np.where(in_range, truncated, _INT_MIN)
    return np.clip(bucket, 0, _N_BUCKETS - 1).astype(np.intp)


def bucket_partial_order(
    logits: npt.NDArray[np.float32], npartial: int, *, needed: int | None = None
) -> Positions:
    """The first `npartial` candidates of `llama_token_data_array_partial_sort`, highest logit first.

    The candidates whose bucket is at or above the one where the count from the top reaches
    `npartial` are gathered bucket by bucket (highest first, input order within a bucket); each full
    bucket is `std::sort`ed, the last one `std::partial_sort`ed up to `npartial`.

    Args:
        logits: the candidates' logits in their current order.
        npartial: how many come out sorted (0 < npartial <= len(logits)).
        needed: if given, only the first `needed` (<= npartial) positions are wanted: buckets that
            lie wholly past them are not sorted (their order cannot change the first `needed`).

    Returns:
        The first `needed` (default `npartial`) positions into `logits`.
    """
    wanted = npartial if needed is None else min(needed, npartial)
    bucket = _bucket_of(logits)
    histogram = np.bincount(bucket, minlength=_N_BUCKETS)
    from_top = np.cumsum(histogram[::-1])
    lowest = _N_BUCKETS - 1 - int(np.argmax(from_top >= npartial))
    chosen = np.flatnonzero(bucket >= lowest)
    chosen = chosen[np.argsort(-bucket[chosen], kind="stable")]
    keys = -logits[chosen]
    pieces: list[Positions] = []
    start = 0
    for j in range(_N_BUCKETS - 1, lowest, -1):
        count = int(histogram[j])
        if start >= wanted:
            break
        if count:
            pieces.append(chosen[start + sort_order(keys[start : start + count], needed=wanted - start)])
            start += count
    remaining = npartial - start
    if remaining > 0 and start < wanted:
        pieces.append(chosen[start + partial_sort_order(keys[start:], remaining, needed=wanted - start)])
    order = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.intp)
    return order[:wanted]


def bucket_value_order(logits: npt.NDArray[np.float32]) -> Positions:
    """Positions in an order whose logit sequence equals that of llama.cpp's full bucket sort.

    Buckets highest first, logits descending within a bucket: what `bucket_partial_order(logits,
    len(logits))` gives except, among equal logits, possibly the order. (Not a plain sort: a
    logit too large for llama.cpp's int conversion lands in the lowest bucket, as it does there.)
    """
    by_logit = np.argsort(-logits, kind="stable")
    return by_logit[np.argsort(-_bucket_of(logits)[by_logit], kind="stable")].astype(np.intp, copy=False)
