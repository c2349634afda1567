"""sampler_worker.cxx_sort: the order libstdc++'s sorts leave equal keys in, and llama.cpp's buckets."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from sampler_worker.cxx_sort import (
    _heap_select_and_sort,
    bucket_partial_order,
    bucket_value_order,
    largest_unique,
    partial_sort_order,
    sort_order,
)
from tests.sampler_worker.conftest import LibStdCxx

# Sizes: 50 arrays per kind and algorithm, 1 to 2,000 keys each (enough for introsort's quicksort
# passes, its depth limit and its final insertion sort, and for heap selects of every width; with
# mostly +inf keys, for heap selects that have fewer finite keys than their width).
CASES_PER_KIND = 50
KINDS = ["distinct", "few-values", "many-ties", "with-nan", "constant", "mostly-inf"]


def _keys(kind: str, rng: np.random.Generator) -> npt.NDArray[np.float32]:
    n = int(rng.integers(1, 2000))
    if kind == "distinct":
        return rng.normal(size=n).astype(np.float32)
    if kind == "few-values":
        return rng.integers(0, 4, size=n).astype(np.float32)
    if kind == "many-ties":
        return (rng.integers(0, 60, size=n) / 3).astype(np.float32)
    if kind == "with-nan":
        keys = (rng.integers(0, 30, size=n) / 7).astype(np.float32)
        keys[rng.random(n) < 0.1] = np.nan
        return keys
    if kind == "mostly-inf":  # negated logits under a grammar mask: most are -inf, a few finite, with ties
        keys = (rng.integers(0, 12, size=n) / 4).astype(np.float32)
        keys[rng.random(n) < 0.9] = np.inf
        return keys
    return np.full(n, 1.5, dtype=np.float32)


def _command(name: str, keys: npt.NDArray[np.float32], middle: int | None = None) -> str:
    values = " ".join(repr(float(v)) for v in keys)
    if middle is None:
        return f"{name} {keys.size} {values}"
    return f"{name} {keys.size} {middle} {values}"


@pytest.mark.oracle
@pytest.mark.parametrize("kind", KINDS, ids=KINDS)
def test_sort_order_matches_std_sort(kind: str, libstdcxx: LibStdCxx) -> None:
    rng = np.random.default_rng(KINDS.index(kind))
    cases = [_keys(kind, rng) for _ in range(CASES_PER_KIND)]
    expected = libstdcxx.run(_command("sort", keys) for keys in cases)
    for keys, positions in zip(cases, expected, strict=True):
        assert sort_order(keys).tolist() == [int(p) for p in positions]


@pytest.mark.oracle
@pytest.mark.parametrize("kind", KINDS, ids=KINDS)
def test_partial_sort_order_matches_std_partial_sort(kind: str, libstdcxx: LibStdCxx) -> None:
    rng = np.random.default_rng(100 + KINDS.index(kind))
    cases = []
    for _ in range(CASES_PER_KIND):
        keys = _keys(kind, rng)
        cases.append((keys, int(rng.integers(1, min(keys.size, 300) + 1))))
    expected = libstdcxx.run(_command("partial", keys, middle) for keys, middle in cases)
    for (keys, middle), positions in zip(cases, expected, strict=True):
        assert partial_sort_order(keys, middle).tolist() == [int(p) for p in positions]


@pytest.mark.parametrize(
    "kind", ["distinct", "few-values", "many-ties", "constant", "peaked", "with-inf", "tie-at-the-cut"]
)
def test_largest_unique_is_the_partial_sort_where_the_largest_are_distinct(kind: str) -> None:
    # Against partial_sort_order of the negated values (itself held to std::partial_sort above), on
    # vocabulary-sized arrays (the grouped pool, its tail of size % 64 included) and small ones (the
    # whole array as the pool): where it answers, the same positions in the same order; where it does
    # not, the largest values tie among themselves or with the next one.
    rng = np.random.default_rng(sum(map(ord, kind)))
    answered = 0
    for case in range(40):
        sizes = [65, 300, 5_000, 151_936, 262_144 + 37]
        n = int(rng.choice(sizes)) if case % 4 else int(rng.integers(2, 200))
        values = (rng.normal(size=n) * 3).astype(np.float32)
        if kind == "few-values":
            values = rng.integers(0, 4, size=n).astype(np.float32)
        elif kind == "many-ties":
            values = (rng.integers(0, 400, size=n) / 3).astype(np.float32)
        elif kind == "constant":
            values = np.full(n, 1.5, dtype=np.float32)
        elif kind == "peaked":  # a few far above the rest, as a confident model's logits are
            values[rng.integers(n, size=3)] = np.float32(25.0) + rng.random(3).astype(np.float32)
        elif kind == "with-inf":
            values[rng.random(n) < 0.3] = -np.inf
        count = int(rng.integers(1, min(n - 1, 128) + 1))
        if kind == "tie-at-the-cut":  # the next one equal to the last one kept: the sort decides
            ranked = np.argsort(-values, kind="stable")
            values[ranked[count]] = values[ranked[count - 1]]
        got = largest_unique(values, count)
        expected = partial_sort_order(-values, count + 1)
        top = values[expected]
        unique = top[count - 1] > top[count] and len(set(top[:count].tolist())) == count
        assert (got is not None) == unique
        if got is not None:
            answered += 1
            assert got.tolist() == expected[:count].tolist()
    if kind in ("distinct", "peaked", "with-inf"):
        assert answered >= 30  # the case it exists for is answered


def test_bucket_partial_order_sorts_in_range_logits_descending() -> None:
    rng = np.random.default_rng(5)
    logits = (rng.normal(size=5000) * 4).astype(np.float32)
    order = bucket_partial_order(logits, 700)
    assert order.size == 700
    assert np.all(np.diff(logits[order]) <= 0)
    assert set(order.tolist()) == set(np.argsort(-logits, kind="stable")[:700].tolist())


def test_bucket_partial_order_puts_logits_too_large_for_an_int_last() -> None:
    # 6.4 * 1e30 + 64 does not fit an int: llama.cpp's conversion yields INT_MIN, clamped to bucket 0
    logits = np.array([1.0, 1e30, 2.0, -5.0], dtype=np.float32)
    assert bucket_partial_order(logits, 4).tolist() == [2, 0, 3, 1]
    assert bucket_value_order(logits).tolist() == [2, 0, 3, 1]


def test_bucket_partial_order_needed_prefix_is_a_prefix() -> None:
    rng = np.random.default_rng(6)
    logits = (rng.integers(-40, 40, size=4000) / 4).astype(np.float32)
    whole = bucket_partial_order(logits, 4000)
    assert bucket_partial_order(logits, 4000, needed=123).tolist() == whole[:123].tolist()


@pytest.mark.parametrize("kind", ["mostly-inf", "many-ties", "few-values", "distinct"])
def test_a_partial_sort_kept_by_order_type_answers_as_the_heap_does_for_other_keys_of_that_type(
    kind: str,
) -> None:
    # The kept order is computed once on dense ranks, then served to every later call whose keys have
    # the same order type: each case is asked first as drawn, then as a strictly increasing map of itself
    # (other values, other gaps, the same ties), and both answers are held to the heap algorithm run
    # on those very keys.
    rng = np.random.default_rng(7 + sum(map(ord, kind)))
    for _ in range(60):
        keys = _keys(kind, rng)[: int(rng.integers(2, 300))].astype(np.float64)
        middle = int(rng.integers(1, keys.size + 1))
        if middle == keys.size:  # no heap select to replay: a whole sort
            middle -= 1
        if middle == 0:
            continue
        remapped = np.where(np.isinf(keys), np.inf, np.exp(keys) * 3 - 100.0)
        for case in (keys, remapped):
            expected = _heap_select_and_sort(case, middle)
            assert partial_sort_order(case, middle).tolist() == expected.tolist()
