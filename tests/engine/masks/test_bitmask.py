"""The packed mask layout: token j is bit j % 32 of word j // 32, little-endian words, padding bits 0."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from constraintd.engine.masks.bitmask import (
    allocate_masks,
    allow_tokens,
    allowed_tokens,
    apply_mask,
    few_allowed_tokens,
    mask_words,
    pack_mask,
    unpack_mask,
)
from constraintd.errors import InputError


@pytest.mark.parametrize(
    ("n", "words"), [(1, 1), (31, 1), (32, 1), (33, 2), (151_936, 4748), (262_144, 8192)]
)
def test_mask_words(n: int, words: int) -> None:
    assert mask_words(n) == words


def test_layout() -> None:
    allowed = np.zeros(70, dtype=bool)
    allowed[[0, 5, 31, 32, 69]] = True
    words = pack_mask(allowed)
    assert words.dtype == np.int32
    assert words.tolist() == [(1 << 0) | (1 << 5) | -(1 << 31), 1, 1 << 5]
    # the bytes on the wire are little-endian words
    assert words.astype("<i4").tobytes()[:4] == bytes([0x21, 0, 0, 0x80])


@given(st.lists(st.booleans(), min_size=1, max_size=200))
def test_round_trip(bits: list[bool]) -> None:
    words = pack_mask(bits)
    assert len(words) == mask_words(len(bits))
    assert unpack_mask(words, len(bits)).tolist() == bits
    assert allowed_tokens(words, len(bits)).tolist() == [i for i, b in enumerate(bits) if b]
    # bits past the vocabulary are 0
    assert not unpack_mask(words, len(words) * 32)[len(bits) :].any()


@given(st.integers(1, 300_000).flatmap(
    lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), max_size=60),
                        st.sets(st.integers(n, ((n + 31) // 32) * 32 + 64), max_size=3))))
def test_allowed_tokens_of_a_vocabulary_sized_mask(case: tuple[int, set[int], set[int]]) -> None:
    # Few allowed among many tokens (only their words are unpacked), or many; bits set past the vocabulary
    # (in its last word, or in words past it) are no tokens.
    n, ids, past = case
    allowed = np.zeros(((n + 31) // 32) * 32 + 96, dtype=bool)
    allowed[sorted(ids | past)] = True
    words = pack_mask(allowed)
    assert allowed_tokens(words, n).tolist() == sorted(ids)
    # the same where few pairs of words hold them, and None (not a wrong answer) where more do
    few = few_allowed_tokens(words, n)
    pairs = {word // 2 for word in np.flatnonzero(words[: mask_words(n) // 2 * 2]).tolist()}
    if len(pairs) <= 8:
        assert few is not None and few.tolist() == sorted(ids)
    else:
        assert few is None
    dense = pack_mask(np.ones(n, dtype=bool))
    assert allowed_tokens(dense, n).tolist() == list(range(n))
    few = few_allowed_tokens(dense, n)
    if mask_words(n) // 2 <= 8:  # every pair holds bits
        assert few is not None and few.tolist() == list(range(n))
    else:
        assert few is None


@given(
    st.lists(st.booleans(), min_size=1, max_size=300),
    st.lists(st.integers(0, 299), max_size=300),
)
def test_allow_tokens_sets_exactly_those_bits(before: list[bool], ids: list[int]) -> None:
    # few ids take the bit-by-bit way, many the row of bools: both must agree with packing the union
    ids = [i for i in ids if i < len(before)]
    words = pack_mask(before)
    allow_tokens(words, np.array(ids, dtype=np.int64))
    expected = list(before)
    for i in ids:
        expected[i] = True
    assert words.tolist() == pack_mask(expected).tolist()


def test_apply_mask_sets_forbidden_logits_to_minus_infinity() -> None:
    logits = np.arange(40, dtype=np.float32)
    allowed = np.zeros(40, dtype=bool)
    allowed[[1, 33]] = True
    assert apply_mask(logits, pack_mask(allowed)) is logits
    assert np.isfinite(logits).tolist() == allowed.tolist()
    assert logits[33] == 33.0


def test_apply_mask_forbids_the_padding_of_a_longer_output_and_takes_batches() -> None:
    allowed = np.zeros(70, dtype=bool)
    allowed[[0, 5, 31, 32, 63, 69]] = True
    logits = np.arange(100, dtype=np.float32)  # a model's output padded past the 70-token vocabulary
    apply_mask(logits, pack_mask(allowed).tolist())
    assert np.isfinite(logits[:70]).tolist() == allowed.tolist() and np.all(np.isneginf(logits[70:]))
    batch = np.zeros((2, 70))
    apply_mask(batch, pack_mask(allowed))
    assert np.isfinite(batch).tolist() == [allowed.tolist()] * 2


def test_allocated_masks_allow_every_token_and_nothing_past_them() -> None:
    masks = allocate_masks(3, 70)
    assert masks.shape == (3, 3) and masks.dtype == np.int32 and masks.flags.writeable
    for row in masks:
        assert unpack_mask(row, 96).tolist() == [True] * 70 + [False] * 26
    assert allocate_masks(0, 70).shape == (0, 3)
    with pytest.raises(InputError):
        allocate_masks(1, 0)


def test_too_few_words_is_an_input_error() -> None:
    with pytest.raises(InputError):
        unpack_mask(np.zeros(1, dtype=np.int32), 33)
