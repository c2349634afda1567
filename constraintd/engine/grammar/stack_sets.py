# Stack sets as interned, memoizing states: what makes accepting a token cost microseconds.
#
# Contract:
# - A `State` is one stack set (stacks.py), never empty (the empty set is `None`: no way forward), with
#   the facts every question about it needs: the char-class positions on top of its stacks, its
#   token-topped stacks, whether it holds the empty stack (the grammar may end here), and whether a stack
#   has come down to an escape mark (only the stack tops masks/cache.py walks carry one; no character and
#   no token matches it).
# - `StateTable.intern` returns one `State` per distinct stack set, so states compare and hash by identity
#   and memoized transitions are shared by every matcher of the same compiled grammar. The table is a
#   cache: when it outgrows `max_states` it starts afresh (states already handed out keep working; equal
#   stack sets may then be two objects, which costs only cache misses).
# - Transitions give exactly the stack sets of grammar/stacks.py's literal functions (llama.cpp's semantics):
#   `step(cp)` is llama_grammar_accept of one code point; `walk` decides a token as
#   llama_grammar_apply_impl does and yields the char-path stacks llama_grammar_accept_token keeps.
# - A token's first visit interns only the state its code points end in: steps no state has memoized are
#   taken on the stack sets as they are (an interned state met on the way takes over with its memo), so
#   a new path costs one new state, not one per code point.
# - A stack set larger than the caller's `limit` raises LimitError and is not cached; a cached one is
#   checked against each caller's limit on use. A stack deeper than MAX_STACK_DEPTH is refused
#   (LimitError). Deep stacks share their bottoms (stacks.Tail), so a state holds O(1) per stack whatever
#   its depth, and a path down to depth d holds O(d).
# - A stack set deeper than SHARED_DEPTH is not kept in the table: its `State` is private (`shared` is
#   False) and has no number, held only by whoever asked for it (a session's matcher and its trail), and
#   freed with them. No memo leads to a private state, so nothing the grammar keeps leads to one: one
#   session's deep nesting is not the grammar's to keep.
# - A memo holds the number of the state it leads to (`State.id`, in the table's `by_id`), not the state:
#   a dict or tuple of plain ints is out of the cyclic collector's sight, one holding states is walked by
#   every full collection for as long as the grammar is held (about three such objects a state, 60,000
#   with 20 schemas' grammars over qwen2). So a state memoizes only transitions to states numbered in
#   the same table: shared ones of its own table (after a reset, an old state memoizes nothing more).
# - Thread-safety without locks: memo tables are dicts written with single assignments; two threads may
#   compute the same entry, never a wrong one. Numbers are drawn from a counter and never reused, and a
#   reset hands the table a new `by_id` while the old states keep the old one, so a number read from a
#   memo is always found where its state looks it up.
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Final

import numpy as np
import numpy.typing as npt

from constraintd.engine.grammar.elements import CHAR, CHAR_ANY, CHAR_NOT, TOKEN, TOKEN_NOT
from constraintd.engine.grammar.stacks import (
    ESCAPE,
    TAIL_CHUNK,
    CharClass,
    Rules,
    Stack,
    StackSet,
    stack_depth,
)
from constraintd.engine.grammar.utf8 import PartialUtf8
from constraintd.errors import LimitError

__all__ = [
    "DEAD",
    "MAX_STACK_DEPTH",
    "SHARED_DEPTH",
    "ClassRun",
    "KeptMove",
    "Move",
    "State",
    "StateTable",
    "step_stacks",
]

_CHAR_KINDS: Final = frozenset((CHAR, CHAR_NOT, CHAR_ANY))
# The deepest stack a state may hold: JSON nested about 16,000 deep. Memory grows linearly with the depth
# (a JSON-mode matcher 10,000 arrays deep holds about 70 MB); llama.cpp has no such limit; deeper nesting
# is refused here (LimitError), so that one session cannot take the server's memory.
MAX_STACK_DEPTH: Final = 32_768
# The deepest stack set the table keeps (JSON nested about 256 deep): see the module comment.
SHARED_DEPTH: Final = 512
_NO_CODE_POINT: Final = -1
_TOP_CODE_POINT: Final = 1 << 32  # above every value llama.cpp's decoder can produce
DEAD: Final = -1  # the number memoized for no stack (no state takes the code point or the token)

# A token taken from a state: whether llama.cpp's apply allows it, the state and unfinished UTF-8 sequence
# accepting it leaves (None where llama.cpp's accept would leave no stack, or the token is not allowed), and
# the most stacks met on the way (for a caller whose limit is lower than the one it was found under).
Move = tuple[bool, "State | None", PartialUtf8, int]
# A Move as a state memoizes it (`State.moves`): the state after as its number (`State.id`, or DEAD).
KeptMove = tuple[bool, int, PartialUtf8, int]
# A run of states that each take one char class and nothing else (`State.class_run`): the class, how many
# states in a row, and the state after them (None: no stack is left).
ClassRun = tuple[CharClass, int, "State | None"]


class StateTable:
    """The interned states of one compiled grammar."""

    __slots__ = ("_numbers", "_states", "by_id", "max_states", "rules")

    def __init__(self, rules: Rules, *, max_states: int = 200_000) -> None:
        self.rules = rules
        self.max_states = max_states
        self._states: dict[StackSet, State] = {}
        # the shared states by number (the module comment): a dict, as two threads may add at once
        self.by_id: dict[int, State] = {}
        self._numbers = itertools.count()

    def intern(self, stacks: Iterable[Stack], limit: int) -> State | None:
        """The state of a stack set (None when it is empty).

        Raises:
            LimitError: the set has more than `limit` stacks.
        """
        key = stacks if isinstance(stacks, frozenset) else frozenset(stacks)
        if not key:
            return None
        if len(key) > limit:
            raise LimitError(f"the grammar reached {len(key)} stacks, above the limit of {limit}")
        state = self._states.get(key)
        if state is None:
            depth = max(map(len, key))
            if depth > TAIL_CHUNK:  # a stack may hold a tail: count its positions
                depth = max(map(stack_depth, key))
            if depth > MAX_STACK_DEPTH:
                raise LimitError(
                    f"the grammar's stacks reached a depth of {depth}, above the limit of {MAX_STACK_DEPTH} "
                    "(nesting that deep, about half as many brackets in JSON, is refused)"
                )
            if depth > SHARED_DEPTH:
                return State(self, key, shared=False)
            if len(self._states) >= self.max_states:
                for old in self._states.values():
                    old.forget()
                self._states = {}
                self.by_id = {}
            new = State(self, key)
            state = self._states.setdefault(key, new)
            if state is new:
                new.id = next(self._numbers)
                new.peers[new.id] = new
        return state

    def release(self) -> None:
        """Drops every state's memoized transitions and the table itself: what is left of the states is
        held by whoever holds them, without the cycles between them (a state's memo and the states it
        leads to), so the states no one holds are freed at once, not by the cyclic garbage collector.
        States handed out keep working (as after a reset)."""
        for state in self._states.values():
            state.forget()
        self._states = {}
        peers, self.by_id = self.by_id, {}
        peers.clear()

    def known(self, stacks: StackSet) -> State | None:
        """The state of a non-empty stack set if the table holds one already (no new state, no check)."""
        return self._states.get(stacks)

    def __len__(self) -> int:
        return len(self._states)


def step_stacks(rules: Rules, stacks: Iterable[Stack], code_point: int) -> set[Stack]:
    """llama_grammar_accept of one code point on stacks as they are, with no state interned."""
    # What State.step interns.
    # Every token's first visit steps here, so Rules.match_char and the memo of Rules.pop_terminal are
    # read inline, without two method calls per stack and code point.
    found: set[Stack] = set()
    classes, popped, next_terminal = rules.classes, rules.popped, rules.next_terminal
    for stack in stacks:
        if not stack:
            continue
        char_class = classes[stack[-1]]  # None on a token or an escape mark
        if char_class is None:
            continue
        positive, ranges = char_class
        for low, high in ranges:
            if low <= code_point <= high:
                break
        else:
            positive = not positive
        if positive:
            follow = next_terminal[stack[-1]]
            if follow >= 0:  # the next terminal of a sequence: the same depth, still canonical
                found.add((*stack[:-1], follow))
                continue
            after = popped.get(stack)
            found.update(rules.pop_terminal(stack) if after is None else after)
    return found


def _takes_token(rules: Rules, stacks: Iterable[Stack], token: int) -> bool:
    # State.token_matches on stacks as they are
    kinds, values = rules.kinds, rules.values
    for stack in stacks:
        if stack:
            kind = kinds[stack[-1]]
            if kind == TOKEN:
                if values[stack[-1]] == token:
                    return True
            elif kind == TOKEN_NOT and values[stack[-1]] != token:
                return True
    return False


def _members(
    tops: tuple[int, ...], char_class: Callable[[int], CharClass], starts: list[int]
) -> list[tuple[int, ...]]:
    # per interval of code points (`starts`: where each begins, every class's ranges begin and end on
    # one), the tops whose class matches it, in the order of `tops`: each range marks the intervals it
    # covers, so a state of hundreds of tops (an enum's literals) costs its ranges, not tops x intervals
    index = {start: i for i, start in enumerate(starts)}
    count = len(starts)
    members: list[list[int]] = [[] for _ in range(count)]
    for pos in tops:
        positive, ranges = char_class(pos)
        covered: set[int] = set()
        for low, high in ranges:
            covered.update(range(index[low], index.get(high + 1, count)))
        for i in (covered if positive else set(range(count)) - covered):
            members[i].append(pos)
    return [tuple(found) for found in members]


class State:
    """One non-empty stack set of a grammar, with its transitions memoized."""

    __slots__ = (
        "_after",
        "_bounds",
        "_by_match",
        "_char_only",
        "_partial_ok",
        "_steps",
        "by_top",
        "char_tops",
        "has_empty",
        "has_escape",
        "id",
        "moves",
        "peers",
        "shared",
        "stacks",
        "table",
        "token_tops",
    )

    def __init__(self, table: StateTable, stacks: StackSet, *, shared: bool = True) -> None:
        rules = table.rules
        kinds = rules.kinds
        self.table = table
        self.stacks = stacks
        # kept in the table (False: deeper than SHARED_DEPTH, the holder's alone)
        self.shared = shared
        # its number in `peers` (set by the table once it keeps it; DEAD for a private state), and the
        # table's numbering it was made in, where the numbers its memos hold are found
        self.id = DEAD
        self.peers = table.by_id
        self.has_empty = () in stacks
        # char-class position on top of some stack -> those stacks; tuples, not lists: a list is always in the
        # cyclic collector's sight, and a state has about six of them (1.6M objects a full collection walked
        # after 100 schemas' walks over qwen2, 724k of them these lists), while a tuple of stacks of plain
        # positions, and then the dict, leave it at the collector's first pass. Built in one loop with no
        # nested function (a comprehension is one): a state is made on a token's first visit, where every
        # piece of code run for the first time in a while costs its cache misses.
        by_top: dict[int, tuple[Stack, ...]]
        tokens: list[tuple[int, int, Stack]] = []
        escapes = False
        single: Stack = ()
        if len(stacks) == 1:
            (single,) = stacks
        if single and kinds[single[-1]] in _CHAR_KINDS:  # one char-topped stack: a third of the states
            by_top = {single[-1]: (single,)}
        else:
            groups: dict[int, list[Stack]] = {}
            for stack in stacks:
                if not stack:
                    continue
                top = stack[-1]
                kind = kinds[top]
                if kind in _CHAR_KINDS:
                    group = groups.get(top)
                    if group is None:
                        groups[top] = [stack]
                    else:
                        group.append(stack)
                elif kind == ESCAPE:
                    escapes = True
                else:
                    tokens.append((kind, rules.values[top], stack))
            by_top = dict(zip(groups, map(tuple, groups.values()), strict=True))
        self.by_top = by_top
        self.char_tops: tuple[int, ...] = tuple(sorted(by_top)) if len(by_top) > 1 else tuple(by_top)
        # (TOKEN or TOKEN_NOT, token id, stack) for every token-topped stack
        self.token_tops: tuple[tuple[int, int, Stack], ...] = tuple(tokens) if tokens else ()
        # whether a stack has come down to an escape mark (stacks.Rules.escape): the rest is unknown
        self.has_escape = escapes
        # the memos, empty (`forget`, written out for the same reason)
        # code point -> the number of the state after (DEAD: none)
        self._steps: dict[int, int] = {}
        self._by_match: dict[tuple[int, ...], int] = {}
        self._partial_ok: dict[PartialUtf8, bool] = {}
        # `segments`, as two attributes: a pair of them would be one more object per state in the cyclic
        # collector's sight for as long as the grammar is held
        self._bounds: npt.NDArray[np.int64] | None = None
        self._after: tuple[int, ...] | None = None
        self._char_only: State | None = None
        # token -> its Move from a fresh UTF-8 start (filled by matcher.py's accept, `keep_move`)
        self.moves: dict[int, KeptMove] = {}

    def forget(self) -> None:
        """Drop the memoized transitions (the table was reset): as `__init__` leaves them."""
        self._steps = {}
        self._by_match = {}
        self._partial_ok = {}
        self._bounds = None
        self._after = None
        self._char_only = None
        self.moves = {}

    def __len__(self) -> int:
        return len(self.stacks)

    def __repr__(self) -> str:
        return f"<State {len(self.stacks)} stacks>"

    def step(self, code_point: int, limit: int) -> State | None:
        """The state after one code point (llama_grammar_accept), or None when no stack takes it."""
        number = self._steps.get(code_point)
        if number is not None:
            after = None if number == DEAD else self.peers[number]
        else:
            match = self.table.rules.match_char
            matched = tuple(pos for pos in self.char_tops if match(pos, code_point))
            after = self._after_match(matched, limit)
            if self.keeps(after):
                self._steps[code_point] = DEAD if after is None else after.id
        if after is not None and len(after.stacks) > limit:
            raise LimitError(f"the grammar reached {len(after.stacks)} stacks, above the limit of {limit}")
        return after

    def _after_match(self, matched: tuple[int, ...], limit: int) -> State | None:
        number = self._by_match.get(matched)
        if number is not None:
            return None if number == DEAD else self.peers[number]
        found: set[Stack] = set()
        pop = self.table.rules.pop_terminal
        for pos in matched:
            for stack in self.by_top[pos]:
                found.update(pop(stack))
        after = self.table.intern(found, limit)
        if self.keeps(after):
            self._by_match[matched] = DEAD if after is None else after.id
        return after

    def keeps(self, after: State | None) -> bool:
        """Whether this state may memoize a transition to `after`: to no stack, or to a state numbered in
        this state's own numbering (so never to a private one, and nothing new once the table was reset:
        see the module comment)."""
        return after is None or (after.peers is self.peers and after.id != DEAD)

    def known_move(self, token: int) -> Move | None:
        """The Move memoized for `token` from a fresh UTF-8 start (`keep_move`), or None."""
        kept = self.moves.get(token)
        if kept is None:
            return None
        allowed, number, partial, peak = kept
        return allowed, None if number == DEAD else self.peers[number], partial, peak

    def keep_move(self, token: int, move: Move) -> None:
        """Memoizes `move`, the Move of `token` from a fresh UTF-8 start, where `keeps` allows."""
        allowed, after, partial, peak = move
        if after is None:
            self.moves[token] = (allowed, DEAD, partial, peak)
        elif after.peers is self.peers and after.id != DEAD:  # `keeps`, written out
            self.moves[token] = (allowed, after.id, partial, peak)

    def after_token(self, token: int) -> list[Stack]:
        """Where its token-topped stacks go when they take `token` (llama_grammar_match_token)."""
        found: list[Stack] = []
        pop = self.table.rules.pop_terminal
        for kind, value, stack in self.token_tops:
            if (value == token) if kind == TOKEN else (value != token):
                found.extend(pop(stack))
        return found

    def token_matches(self, token: int) -> bool:
        """Whether a token-topped stack takes `token` (as a token with code points left to match)."""
        return any(
            (value == token) if kind == TOKEN else (value != token) for kind, value, _ in self.token_tops
        )

    def accepted(
        self, token: int, code_points: tuple[int, ...], limit: int, *, char_after: State | None = None
    ) -> State | None:
        """The state llama_grammar_accept_token leaves after `token` whose piece decoded to `code_points`.

        Token-topped stacks advance if they take `token`; char-topped stacks take the code points
        (`char_after`, when given, is where `walk` found they lead); empty stacks drop out. None where
        llama.cpp throws (no stack left).
        """
        if code_points:
            if char_after is None:
                char_after = self
                for code_point in code_points:
                    char_after = char_after.step(code_point, limit)
                    if char_after is None:
                        break
        else:
            char_after = self.char_only(limit)
        if not self.token_tops:
            return char_after
        stacks = self.after_token(token)
        if not stacks:
            return char_after
        if char_after is not None:
            stacks.extend(char_after.stacks)
        return self.table.intern(stacks, limit)

    def char_only(self, limit: int) -> State | None:
        """This set without its empty and token-topped stacks: what a piece with no code point keeps."""
        if not self.token_tops and not self.has_empty:
            return self
        if self._char_only is None:
            self._char_only = self.table.intern([s for stacks in self.by_top.values() for s in stacks], limit)
        return self._char_only

    def class_run(self, limit: int, most: int) -> ClassRun | None:
        """The run of states from this one that each take exactly one char class C, the same for all, by
        their char-topped stacks alone (no token-topped stack, no escape mark), at most `most` of them: a
        fixed-length repetition of C (`[0-9a-f]{8}`, a literal's repeated character). Any code point of C
        leads from one to the next and every other one to no stack, so a token's fate in the run depends
        only on how many of its code points in a row C matches (masks/compute.py). None when this state
        is not such a state.

        Raises:
            LimitError: a state of the run has more than `limit` stacks.
        """
        single = self._single_class()
        if single is None:
            return None
        state: State | None = self
        count = 0
        while count < most and state is not None and state._single_class() == single:
            state = state._after_match(state.char_tops, limit)
            count += 1
        return single, count, state

    def _single_class(self) -> CharClass | None:
        # the one char class every stack tops, when no stack is topped by a token or an escape mark
        if self.token_tops or self.has_escape or not self.char_tops:
            return None
        classes = self.table.rules.classes
        first = classes[self.char_tops[0]]
        for pos in self.char_tops[1:]:
            if classes[pos] != first:
                return None
        return first

    def partial_ok(self, partial: PartialUtf8) -> bool:
        """Whether a piece ending in the unfinished sequence `partial` survives here (llama.cpp's apply)."""
        try:
            return self._partial_ok[partial]
        except KeyError:
            match = self.table.rules.match_partial_char
            ok = self._partial_ok[partial] = any(match(pos, partial) for pos in self.char_tops)
            return ok

    def walk(
        self, token: int, code_points: tuple[int, ...], partial: PartialUtf8, limit: int
    ) -> tuple[bool, State | None, int]:
        """Decide one token decoded to `code_points` ending in `partial`, not an end-of-generation token.

        Steps a state knows already are read from its memo; past the first it does not know, the stacks
        are stepped as they are, and only where they end is a state interned (a state met on the way that
        the table holds already takes over with its memo). A first visit so builds one state, not one per
        code point.

        Returns:
            Whether llama_grammar_apply_impl leaves it finite; the state its code points lead to through
            char classes (the stacks llama_grammar_accept_token keeps from char-topped stacks; None when
            they die; meaningless when there are no code points); the most stacks met on the way.
        """
        allowed = False
        state: State | None = self
        stacks: StackSet = self.stacks
        peak = 0
        table = self.table
        rules = table.rules
        known = table._states.get  # StateTable.known, and below State.keeps, written out: the hot path
        for code_point in code_points:
            if state is not None:
                if state.token_tops and not allowed:
                    allowed = state.token_matches(token)
                number = state._steps.get(code_point)
                if number is not None:
                    if number == DEAD:
                        return allowed, None, peak
                    after = state.peers[number]
                    size = len(after.stacks)
                    if size > limit:
                        raise LimitError(f"the grammar reached {size} stacks, above the limit of {limit}")
                    state, stacks = after, after.stacks
                    if size > peak:
                        peak = size
                    continue
            elif not allowed and rules.has_tokens:
                allowed = _takes_token(rules, stacks, token)
            found = step_stacks(rules, stacks, code_point)
            if not found:
                if state is not None:
                    state._steps[code_point] = DEAD
                return allowed, None, peak
            size = len(found)
            if size > limit:
                raise LimitError(f"the grammar reached {size} stacks, above the limit of {limit}")
            if size > peak:
                peak = size
            stacks = frozenset(found)
            met = known(stacks)
            if state is not None and met is not None and met.peers is state.peers and met.id != DEAD:
                state._steps[code_point] = met.id
            state = met
        if state is None:
            state = table.intern(stacks, limit)
            assert state is not None
        if not allowed:
            allowed = partial[1] == 0 or state.partial_ok(partial)
        return allowed, state, peak

    def move(self, token: int, code_points: tuple[int, ...], partial: PartialUtf8, limit: int) -> Move:
        """`walk`, then, for an allowed token, the state llama_grammar_accept_token leaves."""
        allowed, char_after, peak = self.walk(token, code_points, partial, limit)
        if not allowed:
            return False, None, partial, peak
        if code_points and not self.token_tops:  # `accepted`'s answer, without the call (most tokens)
            return True, char_after, partial, peak
        after = self.accepted(token, code_points, limit, char_after=char_after)
        if after is not None and len(after.stacks) > peak:
            peak = len(after.stacks)
        return True, after, partial, peak

    def segments(self, limit: int) -> tuple[npt.NDArray[np.int64], tuple[State | None, ...]]:
        """The code points cut into intervals on which every char class on top answers alike.

        Returns:
            `bounds` (sorted) and `after`: a code point c falls in interval `searchsorted(bounds, c,
            "right")`, and `after[i]` is the state interval i leads to.
        """
        # each read once: another thread's table reset may clear them
        bounds, numbers = self._bounds, self._after
        if bounds is not None and numbers is not None:
            peers = self.peers
            after = tuple(None if number == DEAD else peers[number] for number in numbers)
        else:
            rules = self.table.rules
            cuts: set[int] = set()
            for pos in self.char_tops:
                for low, high in rules.char_class(pos)[1]:
                    cuts.add(low)
                    if high + 1 < _TOP_CODE_POINT:
                        cuts.add(high + 1)
            bounds = np.array(sorted(cuts), dtype=np.int64)
            starts = [_NO_CODE_POINT, *bounds.tolist()]
            members = _members(self.char_tops, rules.char_class, starts)
            after = tuple(self._after_match(matched, limit) for matched in members)
            if all(map(self.keeps, after)):
                self._after = tuple(DEAD if state is None else state.id for state in after)
                self._bounds = bounds
        for state in after:
            if state is not None and len(state.stacks) > limit:
                raise LimitError(
                    f"the grammar reached {len(state.stacks)} stacks, above the limit of {limit}"
                )
        return bounds, after
