"""Interned states: memoized transitions give exactly the literal stack semantics of grammar/stacks.py."""

from __future__ import annotations

import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constraintd.engine.grammar.gbnf import check_grammar, parse_gbnf
from constraintd.engine.grammar.stack_sets import MAX_STACK_DEPTH, SHARED_DEPTH, State, StateTable, _members
from constraintd.engine.grammar.stacks import Rules, accept_char, accept_token, allows_token, stack_depth
from constraintd.engine.grammar.utf8 import FRESH, INVALID, decode_utf8
from constraintd.errors import GrammarError, LimitError
from tests.strategies import grammars, texts

PIECES = st.one_of(
    st.text(alphabet="abcé中😀", min_size=1, max_size=3).map(str.encode),
    st.binary(min_size=1, max_size=3),
    st.sampled_from([b"\xe4", b"\xb8\xad", b"\xad", b"\xc3", b"\xa9c", b"\x9f\x98\x80"]),
)


def table_for(text: str) -> tuple[Rules, StateTable, int]:
    parsed = parse_gbnf(text)
    rules = Rules(parsed)
    return rules, StateTable(rules), check_grammar(parsed)


@settings(max_examples=50, deadline=None)
@given(grammars(), texts(), st.lists(PIECES, min_size=1, max_size=4), st.integers(0, 3))
def test_walk_and_accepted_agree_with_the_literal_functions(
    text: str, prefix: str, pieces: list[bytes], token: int
) -> None:
    try:
        rules, table, root = table_for(text)
    except GrammarError:
        return
    stacks = rules.initial_stacks(root)
    for char in prefix:
        after = accept_char(rules, stacks, ord(char))
        if not after:
            break
        stacks = after
    partial = FRESH
    for piece in pieces:
        state = table.intern(stacks, 10_000)
        assert state is not None
        code_points, end = decode_utf8(piece, partial)
        expected_allowed = allows_token(rules, stacks, token, piece, partial=partial)
        char_after = None
        if end == INVALID or piece[0] == 0:
            assert not expected_allowed  # the matcher refuses these before walking
        else:
            allowed, char_after, _ = state.walk(token, code_points, end, 10_000)
            assert allowed == expected_allowed
        expected, expected_end = accept_token(rules, stacks, partial, token, piece)
        after = state.accepted(token, code_points, 10_000, char_after=char_after)
        assert (after.stacks if after else frozenset()) == expected
        if end != INVALID and piece[0] != 0:
            moved, moved_to, moved_end, _ = state.move(token, code_points, end, 10_000)
            assert (moved, moved_end) == (expected_allowed, end)
            assert moved_to is (after if expected_allowed else None)
        assert end == expected_end
        if not expected:
            return
        stacks, partial = expected, (FRESH if end == INVALID else end)


def test_states_are_interned() -> None:
    rules, table, root = table_for('root ::= ("a" | "b")*\n')
    start = table.intern(rules.initial_stacks(root), 100)
    assert start is not None
    assert start.step(ord("a"), 100) is start.step(ord("b"), 100)
    assert start.step(ord("c"), 100) is None
    assert table.intern(set(start.stacks), 100) is start


def test_a_state_above_the_limit_raises_and_is_not_cached() -> None:
    # every "a" doubles the ways to read the text so far: x{n} is ambiguous
    rules, table, root = table_for('root ::= x*\nx ::= "a" | "a" "b"? | "a" "c"?\n')
    start = table.intern(rules.initial_stacks(root), 100)
    assert start is not None
    with pytest.raises(LimitError):
        start.step(ord("a"), 1)
    assert start.step(ord("a"), 100) is not None


def test_a_full_table_starts_afresh_and_old_states_keep_working() -> None:
    rules, _, root = table_for('root ::= [a-z]+ "."\n')
    table = StateTable(rules, max_states=2)
    start = table.intern(rules.initial_stacks(root), 100)
    assert start is not None
    state = start
    for char in "abc":
        after = state.step(ord(char), 100)
        assert after is not None
        state = after
    assert len(table) <= 2
    final = state.step(ord("."), 100)
    assert final is not None and final.has_empty


def test_segments_cut_code_points_where_the_classes_change() -> None:
    rules, table, root = table_for('root ::= [a-c] "x" | [b-d] "y" | [^b]\n')
    start = table.intern(rules.initial_stacks(root), 100)
    assert start is not None
    bounds, after = start.segments(100)
    assert bounds.tolist() == [ord("a"), ord("b"), ord("c"), ord("d"), ord("e")]
    for code_point in (0x10, ord("a"), ord("b"), ord("c"), ord("d"), ord("e"), 0x4E2D):
        index = int(bounds.searchsorted(code_point, side="right"))
        assert after[index] is start.step(code_point, 100)


RANGES = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 6)), min_size=1, max_size=3).map(
    lambda pairs: [(low, low + width) for low, width in pairs]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), RANGES), min_size=1, max_size=8))
def test_the_members_of_each_interval_are_the_classes_that_match_it(
    drawn: list[tuple[bool, list[tuple[int, int]]]],
) -> None:
    # each interval's tops, found by marking ranges, are the tops whose class matches a code point of it
    classes = {10 + i: (positive, ranges) for i, (positive, ranges) in enumerate(drawn)}
    tops = tuple(classes)
    cuts = {edge for _, ranges in drawn for low, high in ranges for edge in (low, high + 1)}
    starts = [-1, *sorted(cuts)]
    found = _members(tops, classes.__getitem__, starts)
    ends = [*(start - 1 for start in starts[1:]), starts[-1] + 5]
    for start, end, members in zip(starts, ends, found, strict=True):
        for code_point in {start, end}:  # its first and its last (the first interval's is -1 if it is empty)
            expected = tuple(
                pos for pos in tops if any(low <= code_point <= high for low, high in classes[pos][1])
                == classes[pos][0]
            )
            assert members == expected


@settings(max_examples=60, deadline=None)
@given(grammars(), st.lists(texts(), min_size=1, max_size=4), st.integers(1, 4))
def test_a_table_that_starts_afresh_answers_as_the_literal_functions(
    text: str, prefixes: list[str], max_states: int
) -> None:
    # a table of a few states starts afresh again and again; states of every numbering are stepped twice
    # (the second time from their memos, which hold numbers of their own numbering) and still agree
    try:
        rules, _, root = table_for(text)
    except GrammarError:
        return
    table = StateTable(rules, max_states=max_states)
    met: list[tuple[State, frozenset[tuple[int, ...]]]] = []
    for _ in range(2):
        for prefix in prefixes:
            state = table.intern(rules.initial_stacks(root), 10_000)
            stacks = rules.initial_stacks(root)
            for char in prefix:
                assert state is not None
                met.append((state, stacks))
                expected = accept_char(rules, stacks, ord(char))
                after = state.step(ord(char), 10_000)
                assert (after.stacks if after else frozenset()) == expected
                walked = state.walk(0, (ord(char),), FRESH, 10_000)[1]
                assert (walked.stacks if walked else frozenset()) == expected
                bounds, ends = state.segments(10_000)
                end = ends[int(bounds.searchsorted(ord(char), side="right"))]
                assert (end.stacks if end else frozenset()) == expected
                if not expected:
                    break
                state, stacks = after, expected
    for state, stacks in met:  # old states keep working, from their memos and past them
        for code_point in (ord("a"), ord("x"), ord(" ")):
            after = state.step(code_point, 10_000)
            assert (after.stacks if after else frozenset()) == accept_char(rules, stacks, code_point)


def test_memos_and_segments_are_out_of_the_collectors_sight() -> None:
    # a state's memos hold numbers, not states: once collected, no dict or tuple of them is tracked, so a
    # full collection walks the states themselves and not three more objects each
    rules, table, root = table_for('root ::= ("a" [b-d]+ "e")* "."\n')
    start = table.intern(rules.initial_stacks(root), 100)
    assert start is not None
    state = start
    for char in "abcdeab":
        state.segments(100)
        state.walk(0, (ord(char),), FRESH, 100)
        after = state.step(ord(char), 100)
        assert after is not None
        state.keep_move(ord(char), (True, after, FRESH, 1))
        assert state.known_move(ord(char)) == (True, after, FRESH, 1)
        state = after
    gc.collect()
    states = list(table._states.values())
    assert sum(bool(state._steps) for state in states) >= 3
    for state in states:
        assert not gc.is_tracked(state._steps)
        assert not gc.is_tracked(state._by_match)
        assert not gc.is_tracked(state.moves)
        assert state._after is None or not gc.is_tracked(state._after)


def test_states_deeper_than_the_shared_depth_are_their_holders_alone() -> None:
    # one session's deep nesting is not the grammar's to keep: the table holds no state past SHARED_DEPTH,
    # no state it holds memoizes a way to one, and they are freed with whoever asked for them
    rules, table, root = table_for('root ::= "(" root ")" | "x"\n')
    start = table.intern(rules.initial_stacks(root), 100)
    assert start is not None
    path = [start]
    while len(path) <= SHARED_DEPTH + 10:
        after = path[-1].step(ord("("), 100)
        assert after is not None
        path.append(after)
    private = [state for state in path if not state.shared]
    assert private and all(max(map(stack_depth, state.stacks)) > SHARED_DEPTH for state in private)
    assert len(table) == len(path) - len(private)
    for state in path:
        if state.shared:
            assert all(number == -1 or state.peers[number].shared for number in state._steps.values())
    assert path[-1].step(ord("x"), 100) is not None  # private states work as any
    del path, private, after, state
    gc.collect()
    assert not [held for held in gc.get_objects() if isinstance(held, State) and not held.shared]


def test_a_stack_past_the_depth_limit_is_refused() -> None:
    rules, table, root = table_for('root ::= "(" root ")" | "x"\n')
    state = table.intern(rules.initial_stacks(root), 100)
    assert state is not None
    with pytest.raises(LimitError, match="depth"):
        for _ in range(MAX_STACK_DEPTH + 1):
            state = state.step(ord("("), 100)
            assert state is not None


def test_a_forgotten_state_is_as_a_new_one() -> None:
    # `State.__init__` writes its memos out rather than calling `forget`: the two must leave the same state
    rules, table, root = table_for('root ::= "a" [b-d]* "e" | "ab" [^x] "f"\n')
    state = table.intern(rules.initial_stacks(root), 1_000)
    assert state is not None
    for code_point in map(ord, "abx"):
        after = state.step(code_point, 1_000)
        state.move(0, decode_utf8(b"ab")[0], FRESH, 1_000)
        state.partial_ok(FRESH)
        if after is not None:
            state = after
    used = {slot: getattr(state, slot) for slot in State.__slots__}
    assert any(isinstance(value, dict) and value for value in used.values())  # some memo was filled
    state.forget()
    fresh = State(table, state.stacks)
    for slot in State.__slots__:
        if slot != "id":
            assert getattr(state, slot) == getattr(fresh, slot), slot
