# Structural ids of grammar positions: equal ids mean the same verdict on every token, whatever grammar
# they come from.
#
# Contract:
# - `Structure(rules, horizon).position(p)` is an int naming what stack position `p` stands for: the
#   elements from `p` to the end of its alternate, each rule reference replaced by the id of the rule it
#   names, recursively, as far as a token can reach. A token of n code points matches at most n char
#   terminals and then asks about the next one (whether a partial character could continue there), so a
#   part of the grammar that every path reaches only after `horizon` = n + 1 terminals, for the longest
#   token, never changes a verdict: it is cut off (one mark where it starts). Two positions (of one
#   grammar or of two) with the same id therefore match the same code points and tokens, stack for
#   stack, for every token of the vocabulary: whatever is learned from one (masks/cache.py's per-top
#   verdicts) holds for the other.
# - This is how the string, number and value rules that every converted JSON schema repeats are learned
#   once per vocabulary instead of once per grammar, and why a string bounded to 1,000 characters (a
#   chain of nested rules) shares them with an unbounded one: past the horizon they are the same.
# - Counting terminals: a char class or a token element is one; a rule reference is the fewest terminals
#   its rule can match (0 for a rule that can vanish; a lower bound inside a cycle, so forms are cut
#   later, never sooner). A rule that matches at most m terminals gets one form for every budget above
#   m. A reference cycle that matches nothing (a rule reaching itself through vanishing rules, which
#   llama.cpp follows only once) gets the position an id of its own, equal to no other: no sharing, never
#   a wrong one. So does a position whose form takes more than MAX_WORK elements to write (forms already
#   written for its rules are reused free): those are the large, schema-specific ones, met by one
#   grammar and not worth their time.
# - The escape mark (stacks.Rules.escape) has the id ESCAPE_ID.
# - Ids are numbered by a `FormTable`, and are comparable only between structures numbered by the same
#   table: the table belongs to the store of verdicts the ids key (masks/cache.py's `SharedVerdicts`, one
#   per vocabulary), so every grammar on one vocabulary numbers its forms alike, and a store never meets
#   an id another table numbered.
# - Ids are never reused: a table drops its forms when they grow past MAX_FORMS (then equal forms met
#   later get new ids, which costs sharing, not correctness). Thread-safe without locks: two threads may
#   number one form twice, and setdefault keeps one.
from __future__ import annotations

import itertools
from typing import Final

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
from constraintd.engine.grammar.stacks import Rules

__all__ = ["ESCAPE_ID", "MAX_WORK", "FormTable", "Structure"]

ESCAPE_ID: Final = -1
MAX_WORK: Final = 1_000  # elements written for one position's form
MAX_FORMS: Final = 500_000  # forms numbered before the table starts afresh
_BEYOND: Final = -2  # the mark where a form is cut off at the horizon
_TERMINAL_STARTS: Final = frozenset((CHAR, CHAR_NOT, CHAR_ANY, TOKEN, TOKEN_NOT))
_CONTINUATIONS: Final = frozenset((CHAR_ALT, CHAR_RNG_UPPER))
_ENDS: Final = frozenset((END, ALT))
_UNBOUNDED: Final = 1 << 30

class _Cycle(Exception):
    """A rule reached itself without matching anything: its form cannot be written finitely here."""


class _TooLarge(Exception):
    """A position's form took more than MAX_WORK elements to write."""


class FormTable:
    """Numbers structural forms: equal forms, equal ids, for as long as the table keeps them."""

    __slots__ = ("_forms", "_next_id")

    def __init__(self) -> None:
        self._forms: dict[tuple[int, ...], int] = {}
        self._next_id = itertools.count()

    def number(self, form: tuple[int, ...]) -> int:
        """The id of `form`: the one given before if the table still holds it, else a new one."""
        forms = self._forms
        found = forms.get(form)
        if found is None:
            if len(forms) >= MAX_FORMS:
                forms = self._forms = {}
            found = forms.setdefault(form, next(self._next_id))
        return found

    def unique(self) -> int:
        """A new id, equal to no form's and to no other `unique` id."""
        return next(self._next_id)

    def __len__(self) -> int:
        return len(self._forms)


class Structure:
    """The structural ids of one grammar's positions for one horizon, computed on first use and numbered
    by `forms`."""

    __slots__ = ("_bounds", "_busy", "_forms", "_ids", "_rule_ids", "_work", "horizon", "rules")

    def __init__(self, rules: Rules, horizon: int, forms: FormTable) -> None:
        self.rules = rules
        self.horizon = horizon
        self._forms = forms
        self._ids: dict[int, int] = {rules.escape: ESCAPE_ID}
        self._rule_ids: dict[tuple[int, int], int] = {}
        self._busy: set[tuple[int, int]] = set()
        # per rule: the fewest and the most terminals it matches (bounds; -1 until measured)
        n_rules = len(rules.rule_starts)
        self._bounds: tuple[list[int], list[int]] = ([-1] * n_rules, [-1] * n_rules)
        self._work = 0

    def position(self, pos: int) -> int:
        """The structural id of stack position `pos` (see the module comment)."""
        found = self._ids.get(pos)
        if found is None:
            self._work = 0
            try:
                found = self._forms.number((0, *self._sequence(pos, self.horizon)))
            except _Cycle:
                found = self._forms.unique()
                # the rules being written met a cycle: they would again, so they are numbered as their own
                for key in self._busy:
                    self._rule_ids[key] = self._forms.unique()
                self._busy.clear()
            except (_TooLarge, RecursionError):
                found = self._forms.unique()
                self._busy.clear()  # the rules written so far are kept: the next position goes further
            self._ids[pos] = found
        return found

    def stack(self, stack: tuple[int, ...]) -> tuple[int, ...]:
        """The structural ids of a stack's positions, in order."""
        position = self.position
        return tuple(position(pos) for pos in stack)

    def _sequence(self, start: int, budget: int) -> list[int]:
        # One alternate from `start` to its end, as (kind, value) pairs ending in (END, 0), or in
        # (_BEYOND, 0) where every path has matched `budget` terminals already.
        kinds, values = self.rules.kinds, self.rules.values
        least = self._bounds[0]
        form: list[int] = []
        used = 0
        at = start
        work = self._work
        while True:
            kind = kinds[at]
            if kind in _CONTINUATIONS:  # the rest of a char class: part of the terminal begun
                form += (kind, values[at])
            elif used >= budget:
                form += (_BEYOND, 0)  # whatever comes next, the end of the alternate included
                break
            elif kind == RULE_REF:
                rule = values[at]
                self._work = work
                form += (RULE_REF, self._rule(rule, budget - used))  # measures the rule
                work = self._work
                used += least[rule]
            elif kind in _ENDS:
                form += (END, 0)
                break
            else:  # a terminal
                form += (kind, values[at])
                used += 1
            work += 1
            if work > MAX_WORK:
                raise _TooLarge
            at += 1
        self._work = work
        return form

    def _rule(self, rule: int, budget: int) -> int:
        # a rule that matches at most m terminals is cut nowhere by a budget above m: one form for all
        most = self._bounds[1]
        if most[rule] < 0:
            self._measure(rule)
        if budget > most[rule] + 1:
            budget = most[rule] + 1
        key = (rule, budget)
        found = self._rule_ids.get(key)
        if found is None:
            if key in self._busy:
                raise _Cycle
            self._busy.add(key)
            form: list[int] = [1]
            for start in self.rules.alternates[rule]:
                form += (END, 0) if start < 0 else self._sequence(start, budget)
            self._busy.discard(key)
            found = self._rule_ids[key] = self._forms.number(tuple(form))
        return found

    def bounds(self, rule: int) -> tuple[int, int]:
        """The fewest and the most terminals `rule` matches (bounds inside cycles, see `_measure`)."""
        least, most = self._bounds
        if most[rule] < 0:
            self._measure(rule)
        return least[rule], most[rule]

    def _measure(self, root: int) -> None:
        # The fewest and the most terminals of `root` and the rules it reaches not measured yet, in one
        # depth-first walk (iterative: chains of nested rules run thousands deep). A rule met again while
        # it is being measured closes a cycle: it counts as 0 terminals at least and `horizon` at most, a
        # bound on each side, which is all the forms need (they are cut later, never sooner).
        least, most = self._bounds
        open_rules: set[int] = set()
        pending: dict[int, list[list[int]]] = {}  # the items of the open rules, read once
        todo: list[tuple[int, bool]] = [(root, False)]
        while todo:
            rule, done = todo.pop()
            if most[rule] >= 0 or (not done and rule in open_rules):
                continue
            items = pending.pop(rule, None) or self._items(rule)
            if not done:
                pending[rule] = items
                open_rules.add(rule)
                todo.append((rule, True))
                todo.extend(
                    (r, False)
                    for alternate in items
                    for r in alternate
                    if r >= 0 and most[r] < 0 and r not in open_rules
                )
                continue
            fewest, longest = _UNBOUNDED, 0
            for alternate in items:
                low = high = 0
                for item in alternate:
                    if item < 0:
                        low, high = low + 1, high + 1
                    elif most[item] >= 0:
                        low, high = low + least[item], high + most[item]
                    else:  # being measured: a cycle
                        high = self.horizon
                fewest, longest = min(fewest, low), max(longest, min(high, self.horizon))
            least[rule], most[rule] = fewest, longest
            open_rules.discard(rule)

    def _items(self, rule: int) -> list[list[int]]:
        # the rule's alternates as items: -1 for a terminal, the rule id of a reference
        kinds, values = self.rules.kinds, self.rules.values
        found = []
        for start in self.rules.alternates[rule]:
            items: list[int] = []
            at = start
            while at >= 0 and kinds[at] not in (END, ALT):
                if kinds[at] == RULE_REF:
                    items.append(values[at])
                elif kinds[at] in _TERMINAL_STARTS:
                    items.append(-1)
                at += 1
            found.append(items)
        return found
