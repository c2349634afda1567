# Moves learnt ahead: the tokens a forced literal admits, walked before a generation asks for them.
#
# Contract:
# - A state whose next characters are forced (every stack tops the same one-character class, no stack is
#   empty or topped by a token: a literal such as a JSON key's `"name":` continues) admits few tokens
#   that stay in, or start with, that literal: those whose piece is a prefix of it, and those whose piece
#   starts with all of it and whose next code point the stacks after it take, where they take a few ASCII
#   characters only (MAX_NEXT: a key's `:` and spaces, not a string's text). `learn_literal_moves` walks
#   those tokens from the state and memoizes each one's Move on it (`State.keep_move`), so that the
#   accept of such a token on a state's first visit is a memo hit instead of a walk. The Moves are the
#   ones `State.move` gives a matcher's accept: nothing here decides a token differently.
# - `LiteralMoves.learn(stack, deadline)` is a step of a grammar's lookahead (masks/ahead.py visits the
#   reachable stacks, grammar/compiled.py runs it): where a literal begins on a stack's top, the state of
#   that stack alone (a key's literal is nearly always met so: one stack, whatever came before) is
#   interned and its moves learnt. Most states it makes are met by a generation; the others cost their
#   flat share of `nbytes`, as every state does.
# - Bounded: the literal is read up to MAX_LITERAL code points, at most MOVES_PER_STATE tokens are walked
#   from one state and at most the caller's `room` moves kept (the grammar counts them in its `nbytes`);
#   it stops once `deadline` passes, keeping the moves made so far (counted in what it returns).
from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Final

from constraintd.engine.grammar.stack_sets import State, StateTable, step_stacks
from constraintd.engine.grammar.stacks import CharClass, Rules, Stack
from constraintd.engine.grammar.utf8 import INVALID
from constraintd.engine.vocab.decoded import PLAIN, DecodedVocab
from constraintd.errors import DeadlineError, LimitError

__all__ = [
    "MAX_LITERAL",
    "MAX_NEXT",
    "MOVES_PER_STATE",
    "LiteralMoves",
    "forced_literal",
    "learn_literal_moves",
]

# Code points of a forced literal read ahead (a JSON key and the punctuation around it).
MAX_LITERAL: Final = 32
# ASCII characters the stacks after a literal may take, at most, for the tokens going on past it to be
# walked: a key's `:` and the spaces before it, a number's digits, not the text of a string.
MAX_NEXT: Final = 16
# Tokens walked ahead from one state at most: the prefixes of its literal, and the few tokens that go on
# past it that the grammar may take.
MOVES_PER_STATE: Final = 48


class LiteralMoves:
    """The moves one grammar's lookahead memoizes (masks/ahead.py visits its stacks), at most `most`.

    Holds the grammar's table, not the grammar: a grammar's searches hold it, and a grammar they held would
    wait for the cyclic collector to go."""

    __slots__ = ("count", "decoded", "limit", "most", "table")

    def __init__(self, table: StateTable, decoded: DecodedVocab, *, limit: int, most: int) -> None:
        self.table = table
        self.decoded = decoded
        self.limit = limit
        self.most = most
        self.count = 0  # memoized so far

    def learn(self, stack: Stack, deadline: float) -> None:
        """The moves of the tokens a forced literal on top of `stack` admits, memoized on the state of that
        stack alone: a generation that meets that state accepts them from the memo.

        Raises:
            DeadlineError: `deadline` passed (what was memoized is kept and counted; the rest is learnt on
                at the next call, which skips what is kept).
        """
        room = self.most - self.count
        if room <= 0 or _single_code_point(self.table.rules.classes[stack[-1]]) is None:
            return  # no literal begins here: no state is made for it
        try:
            state = self.table.intern((stack,), self.limit)
        except LimitError:
            return
        if state is None or not state.shared:
            return
        self.count += learn_literal_moves(state, self.decoded, self.limit, room, deadline=deadline)
        if time.monotonic() > deadline:  # stopped midway, maybe
            raise DeadlineError("learning moves ahead ran past its time limit")


def _single_code_point(char_class: CharClass | None) -> int | None:
    """The one code point a character class takes, if it takes exactly one (a literal's character)."""
    if char_class is None:
        return None
    positive, ranges = char_class
    if not positive or len(ranges) != 1 or ranges[0][0] != ranges[0][1]:
        return None
    return ranges[0][0]


def forced_literal(rules: Rules, stacks: Iterable[Stack]) -> tuple[list[int], set[Stack]]:
    """The code points forced from `stacks` on (up to MAX_LITERAL), and the stacks after them."""
    literal: list[int] = []
    found = set(stacks)
    classes = rules.classes
    while len(literal) < MAX_LITERAL and found:
        forced = -1
        for stack in found:
            # None: a token, an escape or the end, or a class of more than one code point
            only = _single_code_point(classes[stack[-1]]) if stack else None
            if only is None or (forced >= 0 and only != forced):
                return literal, found
            forced = only
        literal.append(forced)
        found = step_stacks(rules, found, forced)
    return literal, found


def learn_literal_moves(
    state: State, decoded: DecodedVocab, limit: int, room: int, *, deadline: float | None = None
) -> int:
    """Walk, from `state`, the tokens its forced literal admits (see the module comment) and memoize their
    Moves on it, at most `room` of them, until `deadline` (time.monotonic(), or an Interruption) passes;
    how many were memoized. A token whose walk meets more than `limit` stacks is left to the accept that
    meets it."""
    rules = state.table.rules
    literal, after = forced_literal(rules, state.stacks)
    if not literal or room <= 0:
        return 0
    try:
        text = "".join(map(chr, literal)).encode("utf-8")
    except UnicodeEncodeError:  # a surrogate in a literal: no piece is its encoding
        return 0
    tokens: list[int] = []
    for end in range(1, len(text) + 1):
        tokens.extend(decoded.tokens_of_piece(text[:end]))
    # past the literal, where the stacks after it take a few ASCII characters only (punctuation, spaces:
    # a key's `":`), the tokens whose next byte is one of them, read from the pieces' sorted index a next
    # byte at a time; where they take more (a string's content after its opening quote), what follows is
    # the document's own text, and no token of it is guessed
    tops = {rules.classes[stack[-1]] for stack in after if stack}
    next_bytes: set[int] = set()
    for char_class in tops:
        if char_class is None:
            continue
        positive, ranges = char_class
        if not positive or any(high >= 0x80 for _, high in ranges):
            return _walk(state, tokens, decoded, limit, room, deadline)
        for low, high in ranges:
            next_bytes.update(range(max(low, 1), high + 1))
        if len(next_bytes) > MAX_NEXT:
            return _walk(state, tokens, decoded, limit, room, deadline)
    for byte in sorted(next_bytes):
        tokens.extend(decoded.tokens_with_prefix(text + bytes((byte,))))
    return _walk(state, tokens, decoded, limit, room, deadline)


def _walk(
    state: State, tokens: list[int], decoded: DecodedVocab, limit: int, room: int, deadline: float | None
) -> int:
    # memoize the Moves of `tokens` (the first MOVES_PER_STATE, at most `room`) from `state`
    kept = 0
    moves, kinds = state.moves, decoded.kind_of
    for token in tokens[:MOVES_PER_STATE]:
        if kept >= room:
            break
        if token in moves or kinds[token] != PLAIN:
            continue
        if deadline is not None and time.monotonic() > deadline:
            break
        code_points, partial = decoded.decode(token)
        if partial == INVALID:
            continue
        try:
            move = state.move(token, code_points, partial, limit)
        except LimitError:
            continue
        state.keep_move(token, move)
        kept += token in moves
    return kept
