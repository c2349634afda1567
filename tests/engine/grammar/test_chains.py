"""Bounded repetitions: the chain rules found and the positions past the horizon sharing one mask; the
copies of a minimum borrowing verdicts from one another."""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from constraintd.engine import Grammar, Matcher, Vocab, unpack_mask
from constraintd.engine.grammar.chains import ChainAliases, bounded_chains
from constraintd.engine.grammar.gbnf import parse_gbnf
from constraintd.engine.grammar.stack_sets import SHARED_DEPTH
from constraintd.engine.grammar.stacks import Rules
from constraintd.engine.masks.cache import MaskCache
from constraintd.engine.masks.compute import compute_mask

# Pieces of at most 7 code points; the longest one also with an unfinished sequence after them, which
# only a chain with an eighth repetition left can take (`[^"]` takes the code point it may become).
PIECES = [
    b"</s>",
    b'"',
    b".",
    b'".',
    b"a",
    b"aa",
    b'a"',
    b"abcdefg",
    b"abcdefg\xc3",
    b"\xa9",
    b"\xa9a",
    b"\\",
    b"\\n",
    b'a\\"',
    b"ab\\nab",
    *(b"abcdefg"[:n] for n in range(2, 7)),
    b"ba",
    b"bab",
    b"bb\\",
]
VOCAB = Vocab(PIECES, eog_ids=[0])
LONGEST = 7  # code points of the longest pieces: the masks' horizon is 9


def _rules(text: str) -> Rules:
    return Rules(parse_gbnf(text))


def _depths(text: str) -> list[int]:
    return sorted(bounded_chains(_rules(text))[0].values())


def test_the_chain_rules_and_their_depths() -> None:
    assert _depths('root ::= "x" [ab]{0,5} "y"\n') == [1, 2, 3, 4, 5]
    assert _depths('root ::= [ab]{2,4}\n') == [1, 2]  # two copies, then two optional repetitions
    assert _depths('root ::= "<" item{0,3} ">"\nitem ::= "a" | "bc"\n') == [1, 2, 3]
    assert _depths('root ::= [ab]* [c]+ [d]?\n') == [1]  # only `?`: a loop is no chain
    # a repetition that may take nothing does not bound what a token goes through: only its `?` is one
    assert _depths('root ::= ("a"?){0,4}\n') == [1]


def test_positions_past_the_horizon_map_to_the_horizons_rule() -> None:
    rules = _rules('root ::= "x" [ab]{0,20} "y"\n')
    depth, shorter = bounded_chains(rules)
    by_depth = {k: rule for rule, k in depth.items()}
    assert all(shorter[by_depth[k]] == by_depth[k - 1] for k in range(2, 21))
    aliases = ChainAliases(rules, 6)
    assert aliases.active
    for k in range(2, 21):
        start = rules.rule_starts[by_depth[k]]
        target = rules.rule_starts[by_depth[min(k, 6)]]
        # [ab] is two elements (a char and a char alt), then the reference to the rule below
        assert aliases.same_stack((0, start + 2, start)) == (0, target + 2, target)
    assert not ChainAliases(rules, 20).active
    assert aliases.same_stack((0, 1)) == (0, 1)


def _expected(matcher: Matcher) -> np.ndarray:
    state = matcher.grammar._states.intern(matcher.stacks, 10**6)
    return compute_mask(state, matcher.partial_utf8, matcher.grammar._decoded, 10**6)


def test_a_long_strings_first_positions_share_one_mask() -> None:
    grammar = Grammar.from_gbnf('root ::= "\\"" [^"]{0,30} "\\"" "."\n', VOCAB)
    matcher = Matcher(grammar)
    assert matcher.accept(PIECES.index(b'"'))
    masks = []
    for _ in range(12):  # positions 30 down to 19: all past the horizon
        masks.append(matcher.mask())
        assert masks[-1].tolist() == _expected(matcher).tolist()
        assert matcher.accept(PIECES.index(b"a"))
    assert all(mask is masks[0] for mask in masks)  # one mask, composed once
    for _ in range(10):  # on to the last repetitions, each its own
        assert matcher.mask().tolist() == _expected(matcher).tolist()
        assert matcher.accept(PIECES.index(b"a"))


def test_the_longest_piece_with_an_unfinished_end_needs_a_repetition_more() -> None:
    # at 8 repetitions left, 7 code points and an unfinished sequence pass; at 7 they do not: a mask
    # borrowed across that line (too short a horizon) would be wrong
    token = PIECES.index(b"abcdefg\xc3")
    for left, allowed in ((8, True), (7, False)):
        grammar = Grammar.from_gbnf(f'root ::= "\\"" [^"]{{0,{left}}} "\\"" "."\n', VOCAB)
        matcher = Matcher(grammar)
        assert matcher.accept(PIECES.index(b'"'))
        assert bool(unpack_mask(matcher.mask(), len(PIECES))[token]) is allowed


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["{0,9}", "{0,10}", "{0,11}", "{0,16}", "{3,25}", "{1,40}", "{12,12}", "{0,2}"]),
    st.sampled_from(['"\\"" "."', '"\\"" "."?', '"\\"" [^"]{0,12} "\\""', '"\\"" ("," [^"]{0,30})* "\\""']),
    st.lists(st.integers(0, 10**6), max_size=40),
)
def test_masks_along_long_chains_are_the_walked_masks(bound: str, after: str, choices: list[int]) -> None:
    grammar = Grammar.from_gbnf(f'root ::= "\\"" [^"]{bound} {after}\n', VOCAB)
    matcher = Matcher(grammar)
    for choice in [*choices, None]:
        mask = matcher.mask()
        assert mask.tolist() == _expected(matcher).tolist()
        allowed = np.flatnonzero(unpack_mask(mask, len(PIECES)))
        if choice is None or allowed.size == 0 or not matcher.accept(int(allowed[choice % allowed.size])):
            break


def test_the_lookahead_visits_a_long_chains_first_positions_once() -> None:
    # without the aliases each of the 200 positions would be a stack of its own to learn
    grammar = Grammar.from_gbnf('root ::= "\\"" [^"]{0,200} "\\"" "."\n', VOCAB)
    run = grammar.lookahead(30.0)
    assert run.finished
    assert run.stacks < 2 * (LONGEST + 2) + 10, run


# A JSON-like string character: a class, or a backslash and one of two letters.
CHAR = 'x ::= [^"\\\\] | [\\\\] ["n]\n'
# Many short pieces besides: the long ones a copy walks are a small share of the vocabulary, as in a real one.
COPY_PIECES = PIECES + [bytes((a, b)) for a in b"abcdefgh" for b in b"abcdefgh"] + [b"q", b"r", b"s", b"["]
COPY_VOCAB = Vocab(COPY_PIECES, eog_ids=[0])


def _follow(matcher: Matcher, choices: list[int]) -> None:
    for choice in [*choices, None]:
        mask = matcher.mask()
        assert mask.tolist() == _expected(matcher).tolist()
        allowed = np.flatnonzero(unpack_mask(mask, matcher.grammar.n_vocab))
        if choice is None or allowed.size == 0 or not matcher.accept(int(allowed[choice % allowed.size])):
            break


def test_copies_of_a_minimum_borrow_from_the_copy_before() -> None:
    # its own vocabulary: no verdict learnt by another test
    grammar = Grammar.from_gbnf('root ::= "\\"" x{14,14} "\\"" "."\n' + CHAR, Vocab(COPY_PIECES, eog_ids=[0]))
    matcher = Matcher(grammar)
    assert matcher.accept(COPY_PIECES.index(b'"'))
    borrowed: list[bool] = []
    original = MaskCache._from_copy

    def counted(self: MaskCache, *args: object) -> object:
        found = original(self, *args)  # type: ignore[arg-type]
        borrowed.append(found is not None)
        return found

    with mock.patch.object(MaskCache, "_from_copy", counted):
        for piece in [b"a", b"\\n", b"a", b"abcdefg", b"a", b"a"]:
            assert matcher.mask().tolist() == _expected(matcher).tolist()
            assert matcher.accept(COPY_PIECES.index(piece))
        assert matcher.mask().tolist() == _expected(matcher).tolist()
    assert any(borrowed)  # a copy after the first borrowed its verdict, a jump of several copies too


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 20),
    st.sampled_from(['"\\"" "."', '"\\"" "."?', 'x{0,3} "\\""', '"\\"" x{2,2} "."']),
    st.lists(st.integers(0, 10**6), max_size=30),
)
def test_masks_along_copies_are_the_walked_masks(copies: int, after: str, choices: list[int]) -> None:
    grammar = Grammar.from_gbnf(f'root ::= "\\"" x{{{copies},{copies}}} {after}\n' + CHAR, COPY_VOCAB)
    _follow(Matcher(grammar), choices)


def test_a_sessions_private_state_is_not_kept_by_the_grammar() -> None:
    # a string inside nesting deeper than SHARED_DEPTH: its states are the session's alone, and the
    # grammar's memory of aliased states keeps none of them
    grammar = Grammar.from_gbnf('root ::= "[" root "]" | "\\"" [^"]{0,40} "\\""\n', COPY_VOCAB)
    matcher = Matcher(grammar)
    opening = COPY_PIECES.index(b"[")
    for _ in range(SHARED_DEPTH + 8):
        assert matcher.accept(opening)
    assert matcher.accept(COPY_PIECES.index(b'"'))
    masks = grammar._masks
    for _ in range(3):
        assert matcher.mask().tolist() == _expected(matcher).tolist()
        state = masks.states.intern(matcher.stacks, 10**6)
        assert state is not None and not state.shared
        same = masks._same_state(state, 10**6)
        assert same is not state and not same.shared  # aliased, and private as well
        assert matcher.accept(COPY_PIECES.index(b"a"))
    kept = masks._same.items()
    assert all(state.shared and same.shared for state, same in kept)
    assert not any(same is not state for state, same in kept)  # the aliased ones were all private
