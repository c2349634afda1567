# The pushdown stacks of llama.cpp's grammar (llama-grammar.cpp), over a flattened rule table.
#
# Contract:
# - `Rules` flattens a `ParsedGrammar` into one element array: a grammar position is an int index into
#   it, a stack is a tuple of positions (bottom first, top last), a stack set is a frozenset of stacks.
#   llama.cpp keeps a de-duplicated vector of stacks; its order never changes what is allowed, so a set
#   is the same thing.
# - Every stack in a set is "advanced" (llama_grammar_advance_stack): empty (the grammar is complete) or
#   topped by a terminal: a character class or a token element. Positions below the top are what follows
#   each pending rule reference.
# - `advance_stack` gives the same set as llama.cpp's advance_stack. It does not walk the rules each time:
#   `Rules` computes, once per rule-reference position, the stacks that reference expands to (`_Closure`),
#   in an order that needs no recursion. A cycle there is left recursion; llama.cpp's own check misses
#   the kind that goes through a rule it does not see may be empty (an alternate of nullable references),
#   and then never returns, so such a grammar is refused here. Without such a cycle (every grammar the
#   schema converter writes) a position's closure is computed the first time a stack meets it, with those
#   it depends on: a session reaches a small part of a large grammar, and the compile pays for none of it.
#   With one, every closure is computed when the rules are built, and the refusal comes then. Such a cycle
#   is also the only place llama.cpp's left-recursion check can refuse (its cycles are among these), so
#   `Rules` makes that check there, first: `Grammar` builds the rules right after the other checks and
#   leaves this one to them (a cycle-free grammar, every grammar the converter writes, is not searched twice).
# - `match_char` and `match_partial_char` are llama.cpp's llama_grammar_match_char and
#   llama_grammar_match_partial_char, quirks included (a negated class rejects a partial sequence as soon
#   as one of its ranges overlaps the code points the sequence could still become).
# - A deep stack shares its bottom with the stacks it came from: its positions below the top ones are
#   folded into `Tail`s, chunks of TAIL_CHUNK positions each linked to the chunk below, and the stack keeps
#   one `Tail` as its first element. The form is canonical (it depends on the positions alone, not on how
#   they were pushed): the chunks are aligned from the bottom, and between TAIL_CHUNK and 2 * TAIL_CHUNK - 1
#   positions stay above them, so a stack is folded once it holds 2 * TAIL_CHUNK positions of its own.
#   A state d deep so holds O(TAIL_CHUNK) per stack, not O(d), and a path down to it O(d): memory linear
#   in the depth. Only advance_stack folds and unfolds; every stack it returns is canonical, its top a
#   position, and everything above the tail (what matching and masks look at) plain positions.
# - `pop_terminal` remembers what it gave for stacks without a tail (up to MAX_POPPED of them, then it
#   starts afresh): a token's first visit steps stack sets no state holds, made of stacks that other
#   paths popped before. A deep stack's pops are not kept: it belongs to its session (stack_sets.py).
# - The functions at the end are the literal semantics the faster stack_sets.py memoizes and the tests hold
#   it to: llama_grammar_accept (one code point), llama_grammar_accept_token, llama_grammar_accept_str,
#   and whether llama_grammar_apply_impl leaves one token's logit finite.
from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from typing import Final, cast

from constraintd.engine.grammar.checks import check_left_recursion, first_cycle
from constraintd.engine.grammar.elements import (
    ALT,
    CHAR,
    CHAR_ALT,
    CHAR_ANY,
    CHAR_NOT,
    CHAR_RNG_UPPER,
    END,
    RULE_REF,
    TOKEN,
    TOKEN_NOT,
)
from constraintd.engine.grammar.gbnf import ParsedGrammar
from constraintd.engine.grammar.utf8 import FRESH, PartialUtf8, decode_utf8
from constraintd.errors import GrammarError

__all__ = [
    "DICT_ENTRY_BYTES",
    "INT_BYTES",
    "PAIR_BYTES",
    "TAIL_CHUNK",
    "Rules",
    "Stack",
    "StackSet",
    "Tail",
    "accept_char",
    "accept_str",
    "accept_token",
    "allows_token",
    "stack_depth",
    "stacks_bytes",
]

# A stack's positions, bottom first; a deep one starts with a `Tail` (its first element only), and is typed
# as positions all the same: every position a caller reads (the top, the few below it) is an int.
Stack = tuple[int, ...]
StackSet = frozenset[Stack]
# Positions a Tail holds, and so half the most a stack keeps above its tail.
TAIL_CHUNK: Final = 16
# Stacks whose pops a grammar's rules remember (`Rules.pop_terminal`) before they start afresh.
MAX_POPPED: Final = 1 << 16

# Not an element of llama.cpp's: a mark put under a stack to stand for "whatever is below" (see Rules.escape).
ESCAPE: Final = -1
TERMINAL_KINDS: Final = frozenset((CHAR, CHAR_NOT, CHAR_ANY, TOKEN, TOKEN_NOT))
TOKEN_KINDS: Final = frozenset((TOKEN, TOKEN_NOT))
_END_OF_SEQUENCE: Final = frozenset((END, ALT))
_CLASS_MORE: Final = frozenset((CHAR_ALT, CHAR_RNG_UPPER))  # what continues a character class
_ANY_RANGE: Final = (0, 0xFFFFFFFF)  # `.` behaves as a range over every uint32
_MAX_CLOSURE: Final = 1 << 16  # stacks one rule reference may expand to, before left recursion is assumed
# CPython's sizes (64-bit), for the estimates of what grammars hold: an int past the cached small ones, a
# 2-tuple, and a dict entry (hash, key, value, index, at the table's usual fill).
INT_BYTES: Final = 32
PAIR_BYTES: Final = sys.getsizeof((0, 1))
DICT_ENTRY_BYTES: Final = 48

# A character class: (positive, inclusive ranges). A single char is the range (c, c); `.` is _ANY_RANGE.
CharClass = tuple[bool, tuple[tuple[int, int], ...]]
# What a stack topped by one rule-reference position advances to: the stacks above the reference's own
# level (each ending at a terminal), and whether the reference can also vanish, uncovering the stack below.
_Closure = tuple[tuple[Stack, ...], bool]


class Tail:
    """The bottom of a deep stack: TAIL_CHUNK positions (bottom first) above the Tail `below` (or nothing).

    Equal by value, with the hash computed once, so that two stacks folded apart still compare equal.
    """

    __slots__ = ("_hash", "below", "depth", "positions")

    def __init__(self, below: Tail | None, positions: tuple[int, ...]) -> None:
        self.below = below
        self.positions = positions
        self.depth: int = len(positions) + (below.depth if below is not None else 0)
        self._hash = hash((below, positions))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tail):
            return NotImplemented
        a: Tail | None = self
        b: Tail | None = other
        while a is not b:  # iterative: a chain is as long as the stack is deep
            if a is None or b is None or a._hash != b._hash or a.positions != b.positions:
                return False
            a, b = a.below, b.below
        return True

    def __repr__(self) -> str:
        return f"<Tail {self.depth} deep>"

    def unfolded(self) -> Stack:
        """The stack this tail stands for, with one chunk less folded."""
        if self.below is None:
            return self.positions
        return cast(Stack, (self.below, *self.positions))


def stack_depth(stack: Stack) -> int:
    """How many positions a stack holds, those folded into its tail included."""
    if len(stack) > TAIL_CHUNK and isinstance(stack[0], Tail):
        return stack[0].depth + len(stack) - 1
    return len(stack)


def _canonical(stack: Stack) -> Stack:
    # the one form of these positions (see the module comment): chunks folded or unfolded until the
    # positions above the tail number TAIL_CHUNK to 2 * TAIL_CHUNK - 1 (or fewer than 2 * TAIL_CHUNK, and
    # no tail)
    tail: Tail | None = None
    above = stack
    if stack and isinstance(stack[0], Tail):
        tail, above = stack[0], stack[1:]
    while tail is not None and len(above) < TAIL_CHUNK:
        above = (*tail.positions, *above)
        tail = tail.below
    while len(above) >= 2 * TAIL_CHUNK:
        tail, above = Tail(tail, above[:TAIL_CHUNK]), above[TAIL_CHUNK:]
    if tail is None:
        return above
    return cast(Stack, (tail, *above))


class Rules:
    """A grammar's rules as one flat element table, with the per-position facts the stacks need."""

    __slots__ = (
        "_closures",
        "_nullable",
        "after",
        "alternates",
        "classes",
        "closure_bytes",
        "escape",
        "has_tokens",
        "kinds",
        "next_terminal",
        "popped",
        "rule_starts",
        "values",
    )

    def __init__(self, parsed: ParsedGrammar) -> None:
        kinds: list[int] = []
        values: list[int] = []
        starts: list[int] = []
        for rule in parsed.rules:
            starts.append(len(kinds))
            rule_kinds, rule_values = zip(*rule, strict=True)
            if parsed.well_formed:  # the parser's elements are plain ints already
                kinds += rule_kinds
                values += rule_values
            else:  # a hand-built grammar may hold GreType members
                kinds += map(int, rule_kinds)
                values += map(int, rule_values)
        # A position past the rules, of kind ESCAPE: a stack (escape, p) is position p with the rest of the
        # stack unknown. Advancing stops on it as on a terminal; nothing matches it.
        self.escape = len(kinds)
        kinds.append(ESCAPE)
        values.append(0)
        self.kinds: tuple[int, ...] = tuple(kinds)
        # whether some element is a token terminal (most grammars have none: no stack is ever token-topped)
        self.has_tokens = not TOKEN_KINDS.isdisjoint(self.kinds)
        self.values: tuple[int, ...] = tuple(values)
        self.rule_starts: tuple[int, ...] = tuple(starts)
        # alternates[rule]: where each alternate starts; -1 for an empty alternate
        self.alternates: tuple[tuple[int, ...], ...] = tuple(self._alternates(s) for s in starts)
        # classes[pos] / after[pos]: the class at a char position (None elsewhere), and the position
        # following a terminal (-1 when the terminal ends its alternate); next_terminal[pos]: that position
        # when it is a terminal too (popping this one then replaces the top, nothing to advance), else -1.
        # Tables indexed by position, not maps: a map made a key and a value object a position (three
        # million small objects for a grammar of 70,000 alternatives, rebuilt in the server from the compile
        # process's pickle), and the few objects allocated meanwhile that outlive them pinned the small-object
        # allocator's arenas they shared (tens of MiB after the grammar was gone). The arrays hold machine
        # ints and the tuple shared class objects: a handful of blocks, whatever the grammar's size.
        size = len(kinds)
        classes: list[CharClass | None] = [None] * size
        after = array("i", bytes(4 * size))
        next_terminal = array("i", b"\xff" * (4 * size))
        single: dict[int, CharClass] = {}  # a literal character's class, one object per character
        for pos, kind in enumerate(kinds):
            if kind == CHAR and kinds[pos + 1] not in _CLASS_MORE:  # one character (most of a grammar's)
                value = values[pos]
                found = single.get(value)
                if found is None:
                    found = single[value] = (True, ((value, value),))
                classes[pos] = found
                end = pos + 1
            elif kind in (CHAR, CHAR_NOT, CHAR_ANY):
                classes[pos], end = self._char_class(pos)
            elif kind in TOKEN_KINDS:
                end = pos + 1
            else:
                continue
            follow = after[pos] = -1 if kinds[end] in _END_OF_SEQUENCE else end
            if follow >= 0 and kinds[follow] in TERMINAL_KINDS:
                next_terminal[pos] = follow
        self.classes: tuple[CharClass | None, ...] = tuple(classes)
        self.after: array[int] = after
        self.next_terminal: array[int] = next_terminal
        self._nullable = self._nullable_rules()
        # position -> its closure: all of them now where the dependencies cycle, else each when first met.
        # Such a cycle is where llama.cpp's left-recursion check may refuse the grammar (its cycles are among
        # these: it continues past a reference to a rule with an empty alternate, these past one to any
        # nullable rule), so it is made there, before the closures; without one it could find nothing.
        cyclic = self._left_cycle()
        if cyclic:
            check_left_recursion(parsed.rules)
        self._closures: dict[int, _Closure] = self._compute_closures() if cyclic else {}
        # an estimate of the bytes the closures hold, kept as they are computed
        self.closure_bytes = sum(map(_closure_bytes, self._closures.values()))
        # shallow stack -> what popping its terminal gives (`pop_terminal`): a token's first visit steps
        # stacks that other paths stepped before (see MAX_POPPED); stack_sets.py reads it, only this writes it
        self.popped: dict[Stack, tuple[Stack, ...]] = {}

    def _alternates(self, start: int) -> tuple[int, ...]:
        found: list[int] = []
        pos = start
        while True:
            found.append(-1 if self.kinds[pos] in _END_OF_SEQUENCE else pos)
            while self.kinds[pos] not in _END_OF_SEQUENCE:
                pos += 1
            if self.kinds[pos] != ALT:
                return tuple(found)
            pos += 1

    def _char_class(self, pos: int) -> tuple[CharClass, int]:
        # the loop of llama_grammar_match_char, reading the class instead of testing one code point
        kinds, values = self.kinds, self.values
        positive = kinds[pos] in (CHAR, CHAR_ANY)
        ranges: list[tuple[int, int]] = []
        while True:
            if kinds[pos + 1] == CHAR_RNG_UPPER:
                ranges.append((values[pos], values[pos + 1]))
                pos += 2
            elif kinds[pos] == CHAR_ANY:
                ranges.append(_ANY_RANGE)
                pos += 1
            else:
                ranges.append((values[pos], values[pos]))
                pos += 1
            if kinds[pos] != CHAR_ALT:
                return (positive, tuple(ranges)), pos

    def _compute_closures(self) -> dict[int, _Closure]:
        # Closure of a rule reference at position q: for each alternate a of the referenced rule, the stack
        # (q + 1, a) advanced, where q + 1 is dropped when it ends q's alternate. It needs the closures of
        # the alternates' first positions and, when the referenced rule can vanish, of q + 1, so they are
        # computed in depth-first post-order. A cycle among these dependencies is left recursion: where it
        # never grows the stack llama.cpp's `seen` set ends the search, and iterating to a fixed point gives
        # the same stacks; where it grows the stack llama.cpp never returns, and the grammar is refused.
        order, cyclic = self._dependency_order()
        closures: dict[int, _Closure] = dict.fromkeys(order, ((), False))
        for _ in range(len(order) + 2):
            changed = False
            for pos in order:
                closure = self._closure(pos, closures)
                if cyclic and (closure[1] != closures[pos][1] or set(closure[0]) != set(closures[pos][0])):
                    changed = True
                    if len(closure[0]) > _MAX_CLOSURE:
                        break
                closures[pos] = closure
            else:
                if not changed:
                    return closures
                continue
            break
        raise GrammarError("unsupported grammar, left recursion that never ends (llama.cpp does not return)")

    def _dependency_order(self) -> tuple[list[int], bool]:
        nullable = self._nullable
        order: list[int] = []
        state: dict[int, bool] = {}  # False: in progress, True: done
        cyclic = False
        for root in (pos for pos, kind in enumerate(self.kinds) if kind == RULE_REF):
            if root in state:
                continue
            state[root] = False
            todo: list[tuple[int, list[int]]] = [(root, self._dependencies(root, nullable))]
            while todo:
                pos, deps = todo[-1]
                if deps:
                    dep = deps.pop()
                    if dep not in state:
                        state[dep] = False
                        todo.append((dep, self._dependencies(dep, nullable)))
                    elif not state[dep]:
                        cyclic = True
                    continue
                todo.pop()
                state[pos] = True
                order.append(pos)
        return order, cyclic

    def _nullable_rules(self) -> list[bool]:
        # a rule is nullable when one alternate is made only of references to nullable rules: the least
        # fixed point, found by counting each alternate's references not yet known nullable (linear; a
        # pass per discovery would be quadratic in a chain of optional repetitions)
        kinds, values = self.kinds, self.values
        nullable = [False] * len(self.rule_starts)
        waiting: list[int] = []  # per candidate alternate: its references not yet known nullable
        owner: list[int] = []  # per candidate alternate: its rule
        users: dict[int, list[int]] = {}  # rule -> the candidate alternates referring to it, once a reference
        found: list[int] = []
        for rule, alternates in enumerate(self.alternates):
            for start in alternates:
                if start < 0:
                    found.append(rule)
                    continue
                pos = start
                while kinds[pos] == RULE_REF:
                    pos += 1
                if kinds[pos] not in _END_OF_SEQUENCE:
                    continue  # a terminal: never empty
                alternate = len(owner)
                owner.append(rule)
                waiting.append(pos - start)
                for ref in range(start, pos):
                    users.setdefault(values[ref], []).append(alternate)
        while found:
            rule = found.pop()
            if nullable[rule]:
                continue
            nullable[rule] = True
            for alternate in users.get(rule, ()):
                waiting[alternate] -= 1
                if not waiting[alternate]:
                    found.append(owner[alternate])
        return nullable

    def _left_cycle(self) -> bool:
        # Whether the closures' dependencies (`_dependencies`) hold a cycle. Such a cycle enters a rule at an
        # alternate's start and moves right only past references to nullable rules before it enters the
        # next, so it is a cycle of rules, each leading to the rules its alternates refer to behind nullable
        # references only (and back: such a cycle of rules is one of positions).
        kinds, values, nullable = self.kinds, self.values, self._nullable
        leftmost: list[list[int]] = []
        for alternates in self.alternates:
            refs: list[int] = []
            for start in alternates:
                pos = start
                while pos >= 0 and kinds[pos] == RULE_REF:
                    refs.append(values[pos])
                    if not nullable[values[pos]]:
                        break
                    pos += 1
            leftmost.append(refs)
        return first_cycle(leftmost) is not None

    def _close(self, pos: int) -> _Closure:
        # the closure of `pos`, computed with those it depends on that no stack met yet, in depth-first
        # post-order (acyclic: `_left_cycle` found no cycle, or all were computed when the rules were built)
        closures, nullable = self._closures, self._nullable
        todo: list[tuple[int, list[int]]] = [(pos, self._dependencies(pos, nullable))]
        path = {pos}  # the positions on `todo`: one met again would be a cycle, never ending
        while todo:
            at, deps = todo[-1]
            if deps:
                dep = deps.pop()
                if dep not in closures:
                    if dep in path:
                        raise AssertionError(f"a cycle of closures through {dep} that _left_cycle missed")
                    path.add(dep)
                    todo.append((dep, self._dependencies(dep, nullable)))
                continue
            todo.pop()
            path.discard(at)
            if at not in closures:
                closure = closures[at] = self._closure(at, closures)
                self.closure_bytes += _closure_bytes(closure)
        return closures[pos]

    def _dependencies(self, pos: int, nullable: list[bool]) -> list[int]:
        deps = [a for a in self.alternates[self.values[pos]] if a >= 0 and self.kinds[a] == RULE_REF]
        if nullable[self.values[pos]] and self.kinds[pos + 1] == RULE_REF:
            deps.append(pos + 1)
        return deps

    def _closure(self, pos: int, closures: dict[int, _Closure]) -> _Closure:
        kinds = self.kinds
        follow = pos + 1
        base: Stack = () if kinds[follow] in _END_OF_SEQUENCE else (follow,)
        stacks: dict[Stack, None] = {}
        vanishes = False
        for start in self.alternates[self.values[pos]]:
            uncovered = True  # the alternate can vanish, leaving `base` to advance
            if start >= 0:
                if kinds[start] == RULE_REF:
                    above, uncovered = closures[start]
                    for stack in above:
                        stacks[base + stack] = None
                else:
                    stacks[(*base, start)] = None
                    uncovered = False
            if uncovered:
                if not base:
                    vanishes = True
                elif kinds[follow] == RULE_REF:
                    above, follow_vanishes = closures[follow]
                    stacks.update(dict.fromkeys(above))
                    vanishes = vanishes or follow_vanishes
                else:
                    stacks[base] = None
        return tuple(stacks), vanishes

    def advance_stack(self, stack: Stack) -> list[Stack]:
        """llama_grammar_advance_stack: the advanced stacks `stack` stands for (no duplicates), each in
        its canonical form (see the module comment)."""
        found: list[Stack] = []
        tailed = len(stack) >= TAIL_CHUNK and isinstance(stack[0], Tail)
        descended = False  # stacks from different levels can coincide; one level alone has no duplicates
        kinds = self.kinds
        while True:
            if len(stack) <= 1:
                if not stack:
                    found.append(stack)
                    break
                if isinstance(stack[0], Tail):  # every position above the tail was popped
                    stack = stack[0].unfolded()
                    tailed = True
            top = stack[-1]
            if kinds[top] != RULE_REF:
                found.append(stack)
                break
            rest = stack[:-1]
            above, vanishes = self._closures.get(top) or self._close(top)
            found.extend(rest + s for s in above)
            if not vanishes:
                break
            stack = rest
            descended = True
        if tailed or any(len(s) >= 2 * TAIL_CHUNK for s in found):
            found = [_canonical(s) for s in found]
        return list(dict.fromkeys(found)) if descended else found

    def initial_stacks(self, root_id: int) -> StackSet:
        """The stacks llama_grammar_init_impl starts from: every alternate of the root rule, advanced."""
        stacks: set[Stack] = set()
        for start in self.alternates[root_id]:
            stacks.update(self.advance_stack(() if start < 0 else (start,)))
        return frozenset(stacks)

    def pop_terminal(self, stack: Stack) -> tuple[Stack, ...]:
        """The stacks after the terminal on top of `stack` matched: top replaced by what follows, advanced."""
        popped = self.popped
        found = popped.get(stack)
        if found is None:
            follow = self.after[stack[-1]]
            found = tuple(self.advance_stack(stack[:-1] if follow < 0 else (*stack[:-1], follow)))
            # kept for stacks without a tail only: a deep stack is its session's, never the grammar's
            if len(stack) < TAIL_CHUNK:
                if len(popped) >= MAX_POPPED:
                    popped = self.popped = {}
                popped[stack] = found
        return found

    def char_class(self, pos: int) -> CharClass:
        """The character class at `pos`, a char position."""
        found = self.classes[pos]
        assert found is not None, f"no character class at {pos}"
        return found

    def match_char(self, pos: int, code_point: int) -> bool:
        """llama_grammar_match_char: whether the class at `pos` matches `code_point`."""
        positive, ranges = self.char_class(pos)
        for low, high in ranges:
            if low <= code_point <= high:
                return positive
        return not positive

    def match_partial_char(self, pos: int, partial: PartialUtf8) -> bool:
        """llama_grammar_match_partial_char: whether a continuation of `partial` could match at `pos`."""
        value, n_remain = partial
        if n_remain < 0 or (n_remain == 1 and value < 2):
            return False  # invalid, or an overlong 2-byte form of a 7-bit char
        low = value << (n_remain * 6)
        high = low | ((1 << (n_remain * 6)) - 1)
        if low == 0:
            if n_remain == 2:
                low = 1 << 11
            elif n_remain == 3:
                low = 1 << 16
        positive, ranges = self.char_class(pos)
        for range_low, range_high in ranges:
            if range_low <= high and low <= range_high:
                return positive
        return not positive


def stacks_bytes(stacks: Iterable[Stack]) -> int:
    """An estimate of the bytes of these stacks: each stack tuple, and an int object per slot."""
    return sum(sys.getsizeof(stack) + len(stack) * INT_BYTES for stack in stacks)


def _closure_bytes(closure: _Closure) -> int:
    # the dict entry, its pair, the tuple of stacks and the stacks
    stacks = closure[0]
    return DICT_ENTRY_BYTES + PAIR_BYTES + sys.getsizeof(stacks) + stacks_bytes(stacks)


def _match_token(kind: int, value: int, token: int) -> bool:
    return (value == token) if kind == TOKEN else (value != token)


def accept_char(rules: Rules, stacks: Iterable[Stack], code_point: int) -> StackSet:
    """llama_grammar_accept: the stacks after one code point (empty and token-topped stacks drop out)."""
    found: set[Stack] = set()
    for stack in stacks:
        if stack and rules.kinds[stack[-1]] not in TOKEN_KINDS and rules.match_char(stack[-1], code_point):
            found.update(rules.pop_terminal(stack))
    return frozenset(found)


def accept_token(
    rules: Rules, stacks: StackSet, partial: PartialUtf8, token: int, piece: bytes
) -> tuple[StackSet, PartialUtf8]:
    """llama_grammar_accept_token: the stacks after `token` with `piece`; empty where llama.cpp throws."""
    code_points, partial_after = decode_utf8(piece, partial)
    found: set[Stack] = set()
    for stack in stacks:
        if not stack:
            continue
        kind = rules.kinds[stack[-1]]
        if kind in TOKEN_KINDS:
            if _match_token(kind, rules.values[stack[-1]], token):
                found.update(rules.pop_terminal(stack))
            continue
        current: StackSet = frozenset((stack,))
        for code_point in code_points:
            current = accept_char(rules, current, code_point)
            if not current:
                break
        found.update(current)
    return frozenset(found), partial_after


def accept_str(
    rules: Rules, stacks: StackSet, partial: PartialUtf8, data: bytes
) -> tuple[StackSet, PartialUtf8]:
    """llama_grammar_accept_str: the stacks after the code points of `data`; empty where llama.cpp throws."""
    code_points, partial_after = decode_utf8(data, partial)
    for code_point in code_points:
        stacks = accept_char(rules, stacks, code_point)
    return stacks, partial_after


def allows_token(
    rules: Rules,
    stacks: StackSet,
    token: int,
    piece: bytes,
    *,
    partial: PartialUtf8 = FRESH,
    eog: bool = False,
) -> bool:
    """Whether llama_grammar_apply_impl leaves `token` finite (from a grammar not awaiting a trigger).

    A token is rejected only when every stack rejects it (llama_grammar_reject_candidates); this follows
    llama_grammar_reject_candidates_for_stack for one candidate.
    """
    if eog:
        return () in stacks
    if not piece or piece[0] == 0:
        return False
    code_points, partial_after = decode_utf8(piece, partial)
    return any(_stack_allows(rules, stack, code_points, 0, partial_after, token) for stack in stacks)


def _stack_allows(
    rules: Rules, stack: Stack, code_points: tuple[int, ...], index: int, partial: PartialUtf8, token: int
) -> bool:
    done = index == len(code_points)
    if not stack:
        return done and partial[1] == 0
    top = stack[-1]
    kind = rules.kinds[top]
    if kind in TOKEN_KINDS:
        if done:
            return partial[1] == 0
        return _match_token(kind, rules.values[top], token)
    if done:
        return partial[1] == 0 or rules.match_partial_char(top, partial)
    if not rules.match_char(top, code_points[index]):
        return False
    return any(
        _stack_allows(rules, after, code_points, index + 1, partial, token)
        for after in rules.pop_terminal(stack)
    )
