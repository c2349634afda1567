"""Moves learnt ahead: the tokens a forced literal admits memoized, as the Moves an accept would find."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from constraintd.engine import Grammar, LimitError, Matcher, Vocab
from constraintd.engine.grammar import compiled, literal_moves
from constraintd.engine.grammar.literal_moves import forced_literal, learn_literal_moves
from tests.engine.grammar.collector import collector_off
from tests.strategies import compile_or_skip, grammars, vocabs

PIECES = [b"</s>", b"{", b'{"', b"na", b"name", b'name"', b'":', b'":1', b'":a', b'":"', b"1", b"12", b"}"]
PIECES += [b'"', b"n", b"a", b"m", b"e", b":", "é".encode(), b"\xc3", b"x"]
KEY = 'root ::= "{\\"name\\":" [0-9]+ "}"'


def _grammar(text: str = KEY) -> Grammar:
    return Grammar.from_gbnf(text, Vocab(PIECES, eog_ids=[0]))


def _token(piece: bytes) -> int:
    return PIECES.index(piece)


def test_the_forced_literal_is_read_up_to_where_a_choice_begins() -> None:
    grammar = _grammar()
    assert grammar._initial is not None
    literal, after = forced_literal(grammar._rules, grammar._initial.stacks)
    assert "".join(map(chr, literal)) == '{"name":'
    assert after  # the digits' stacks
    free = _grammar('root ::= [a-z] "x"')
    assert free._initial is not None
    assert forced_literal(free._rules, free._initial.stacks)[0] == []


def test_the_tokens_of_the_literal_and_those_that_go_on_past_it_are_memoized() -> None:
    grammar = _grammar()
    state = grammar._initial
    assert state is not None
    kept = learn_literal_moves(state, grammar._decoded, 10_000, 100)
    memoized = {PIECES[token] for token in state.moves}
    # prefixes of the literal, and the pieces that start with all of it whose next code point is a digit
    assert memoized == {b"{", b'{"'}
    assert kept == len(state.moves)
    # from inside the literal, further on: `":1` goes on into the digits, `":a` and `":"` do not
    matcher = Matcher(grammar)
    assert matcher.accept(_token(b'{"')) and matcher.accept(_token(b"name"))
    inner = matcher._state
    learn_literal_moves(inner, grammar._decoded, 10_000, 100)
    assert {PIECES[token] for token in inner.moves} == {b'"', b'":', b'":1'}
    # each one is the Move a grammar that learnt nothing ahead finds
    plain = _grammar()
    other = Matcher(plain)
    assert other.accept(_token(b'{"')) and other.accept(_token(b"name"))
    for token, (allowed, number, partial, peak) in inner.moves.items():
        code_points, fresh_partial = plain._decoded.decode(token)
        found = other._state.move(token, code_points, fresh_partial, 10_000)
        after = None if number < 0 else inner.peers[number]
        assert (allowed, partial, peak) == (found[0], found[2], found[3])
        assert (after and after.stacks) == (found[1] and found[1].stacks)


def test_room_and_the_bound_per_state_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    grammar = _grammar()
    matcher = Matcher(grammar)
    assert matcher.accept(_token(b'{"'))
    state = matcher._state
    assert learn_literal_moves(state, grammar._decoded, 10_000, 2) == 2 and len(state.moves) == 2
    assert learn_literal_moves(state, grammar._decoded, 10_000, 0) == 0
    fresh = _grammar()
    other = Matcher(fresh)
    assert other.accept(_token(b'{"'))
    monkeypatch.setattr(literal_moves, "MOVES_PER_STATE", 1)
    assert learn_literal_moves(other._state, fresh._decoded, 10_000, 100) == 1


def test_a_passed_deadline_stops_before_any_walk() -> None:
    grammar = _grammar()
    assert grammar._initial is not None
    assert learn_literal_moves(grammar._initial, grammar._decoded, 10_000, 100, deadline=0.0) == 0


def test_the_lookahead_memoizes_what_a_first_accept_then_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    grammar = _grammar()
    assert grammar.lookahead(60.0).finished
    assert grammar._literal_moves is not None and grammar._literal_moves.count > 0
    matcher, plain = Matcher(grammar), Matcher(_grammar())
    hits = 0
    for piece in (b'{"', b"name", b'":1', b"12", b"}", b"</s>"):
        token = _token(piece)
        hits += token in matcher._state.moves
        assert matcher.accept(token) and plain.accept(token)
        assert matcher.stacks == plain.stacks
    assert hits >= 3  # `{"`, `name` and `":1` were walked ahead


def test_nbytes_counts_the_moves_learnt_ahead_and_their_bound_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    grammar = _grammar()
    grammar.lookahead(60.0)
    assert grammar._literal_moves is not None
    moves = grammar._literal_moves.count
    assert moves == sum(len(state.moves) for state in grammar._states._states.values())
    counted = grammar.nbytes
    monkeypatch.setattr(compiled, "MOVE_BYTES", compiled.MOVE_BYTES + 1000)
    assert grammar.nbytes == counted + 1000 * moves
    monkeypatch.setattr(compiled, "MAX_AHEAD_MOVES", 2)
    bounded = _grammar()
    bounded.lookahead(60.0)
    assert bounded._literal_moves is not None and bounded._literal_moves.count == 2
    assert sum(len(state.moves) for state in bounded._states._states.values()) == 2


# after "中", `aa` is allowed (its second `a` meets the token terminal, which llama.cpp's sampler matches by
# the whole token's id) but refused by accept: the redraw must be a token the grammar takes
_TERMINAL_INSIDE_A_TOKEN = Vocab(
    [b"</s>", b"a", b"b", b"c", b"\x80", b"\x98", b"\x9f", b"\xa9", b"\xad", b"\xb8", b"\xc3", b"\xe4",
     b"\xf0", b"aa", b"a", b"a"],
    [0],
)


@settings(max_examples=60, deadline=None)
@given(grammars(), vocabs(), st.lists(st.integers(0, 10**6), max_size=8))
@example('root ::= "中" "a" !<[2]> | ""\n', _TERMINAL_INSIDE_A_TOKEN, [1, 0, 0, 5])
def test_accepts_after_a_lookahead_are_those_of_a_grammar_without(
    text: str, vocab: Vocab, choices: list[int]
) -> None:
    grammar = compile_or_skip(text, vocab)
    grammar.lookahead(60.0)
    plain = compile_or_skip(text, vocab)
    matcher, other = Matcher(grammar, max_stacks=300), Matcher(plain, max_stacks=300)
    with contextlib.suppress(LimitError):
        for choice in choices:
            token = choice % len(vocab)
            accepted = other.accept(token)
            assert matcher.accept(token) == accepted
            assert matcher.stacks == other.stacks and matcher.partial_utf8 == other.partial_utf8
            if not accepted:
                # tokens the grammar accepts: not `allows`, which also lets through a token whose characters
                # run into a token terminal inside it, as llama.cpp's sampler does, though accept refuses it
                taken = np.flatnonzero([other.fork().accept(t) for t in range(len(vocab))])
                if taken.size == 0:
                    break
                token = int(taken[choice % taken.size])
                assert matcher.accept(token) and other.accept(token)
                assert matcher.stacks == other.stacks


def test_a_token_whose_walk_passes_the_limit_is_left_to_its_accept() -> None:
    vocab = Vocab([b"</s>", b"a", b"ab", b"abc"], eog_ids=[0])
    grammar = Grammar.from_gbnf('root ::= "ab" ("c" | "cd")', vocab)
    state = grammar._initial
    assert state is not None
    # after `ab`, two stacks (the two alternates' `c`): above the limit of one
    assert learn_literal_moves(state, grammar._decoded, 1, 100) == 1
    assert sorted(state.moves) == [1]
    assert Matcher(grammar).accept(3)


def test_a_dropped_grammar_after_its_lookahead_frees_its_states_without_the_cyclic_collector() -> None:
    with collector_off() as states:
        before = states()
        grammar = _grammar()
        grammar.lookahead(60.0)
        assert grammar._literal_moves is not None and grammar._literal_moves.count > 0
        assert states() > before
        del grammar
        assert states() == before
