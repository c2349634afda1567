"""The grammar's mask caches: whole masks and per-position verdicts give exactly the walked mask."""

from __future__ import annotations

import contextlib
from unittest import mock

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from constraintd.engine import Grammar, GrammarError, LimitError, Matcher, Vocab, unpack_mask
from constraintd.engine.masks import cache as mask_cache
from constraintd.engine.masks.cache import MaskCache, SharedVerdicts
from constraintd.engine.masks.compute import compute_mask
from tests.strategies import grammars, vocabs

# Strings nested at different depths: the same string position under different stacks.
GRAMMAR = 'root ::= value\nvalue ::= "[" (value ("," value)*)? "]" | "\\"" [^"]* "\\""\n'
PIECES = [
    b"</s>",
    b"[",
    b"]",
    b",",
    b'"',
    b"a",
    b"ab",
    b'a"',
    b'"]',
    b'"],',
    b'"]]',
    b",[",
    b'""',
    b"\xc3",
    b"\xa9",
    b"b",
]
VOCAB = Vocab(PIECES, eog_ids=[0])
TEXTS = ['["a"]', '[["ab"],"a"]', '[[["a","ab"]]]', '[""]']


def walk_states(matcher: Matcher, text: str) -> list[Matcher]:
    by_piece = {piece: token for token, piece in enumerate(PIECES)}
    seen = [matcher.fork()]
    for char in text:
        assert matcher.accept(by_piece[char.encode()])
        seen.append(matcher.fork())
    return seen


def expected_mask(matcher: Matcher) -> np.ndarray:
    state = matcher.grammar._states.intern(matcher.stacks, 10**6)
    return compute_mask(state, matcher.partial_utf8, matcher.grammar._decoded, 10**6)


def test_masks_from_the_caches_are_the_walked_masks() -> None:
    grammar = Grammar.from_gbnf(GRAMMAR, VOCAB)
    for text in TEXTS:
        for matcher in walk_states(Matcher(grammar), text):
            assert matcher.mask().tolist() == expected_mask(matcher).tolist()
    assert grammar._masks.tops > 0


def test_tiny_caches_give_the_same_masks() -> None:
    grammar = Grammar.from_gbnf(GRAMMAR, VOCAB)
    grammar._masks = MaskCache(
        grammar._states, grammar._decoded, max_mask_bytes=1, max_tops=1, shared=SharedVerdicts(max_bytes=1)
    )
    for text in TEXTS:
        for matcher in walk_states(Matcher(grammar), text):
            assert matcher.mask().tolist() == expected_mask(matcher).tolist()
            assert len(grammar._masks) <= 1 and grammar._masks.tops <= 1


def test_a_state_seen_again_gets_the_same_mask_object() -> None:
    grammar = Grammar.from_gbnf(GRAMMAR, VOCAB)
    first, second = Matcher(grammar), Matcher(grammar)
    assert first.mask() is second.mask()
    assert not first.mask().flags.writeable


def test_after_an_unfinished_character() -> None:
    grammar = Grammar.from_gbnf(GRAMMAR, VOCAB)
    matcher = Matcher(grammar)
    assert matcher.accept(1) and matcher.accept(4) and matcher.accept(13)  # [ " and the first byte of é
    assert matcher.mask().tolist() == expected_mask(matcher).tolist()
    assert matcher.allows(14) and not matcher.allows(5)


@settings(max_examples=80, deadline=None)
@given(
    grammars(),
    vocabs(),
    st.lists(st.integers(0, 10**6), max_size=6),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([0, 16]),
)
def test_any_context_depth_gives_the_walked_mask(
    text: str, vocab: Vocab, choices: list[int], depth: int, max_new_tops: int
) -> None:
    # shallow tops leave many tokens uncertain (decided by the walk over them); no new tops: walk whole
    try:
        grammar = Grammar.from_gbnf(text, vocab)
    except GrammarError:
        assume(False)
        return
    matcher = Matcher(grammar, max_stacks=300)
    with (
        mock.patch.object(mask_cache, "CONTEXT_DEPTH", depth),
        mock.patch.object(mask_cache, "MAX_NEW_TOPS", max_new_tops),
        contextlib.suppress(LimitError),
    ):
        for choice in [*choices, None]:
            mask = matcher.mask()
            assert mask.tolist() == expected_mask(matcher).tolist()
            allowed = np.flatnonzero(unpack_mask(mask, len(vocab)))
            if choice is None or allowed.size == 0 or not matcher.accept(int(allowed[choice % allowed.size])):
                break


def test_size_is_reported_and_forgetting_masks_changes_no_answer() -> None:
    vocab = Vocab([b"a", b"b", b"ab", b""], eog_ids=[3])
    grammar = Grammar.from_gbnf('root ::= "a" "b"*', vocab)
    matcher = Matcher(grammar)
    assert grammar._masks.nbytes == 0
    first = matcher.mask()
    assert len(grammar._masks) == 1
    assert grammar._masks.nbytes == first.nbytes
    grammar._masks.forget_masks()
    assert len(grammar._masks) == 0 and grammar._masks.nbytes == 0
    assert np.array_equal(matcher.mask(), first)
