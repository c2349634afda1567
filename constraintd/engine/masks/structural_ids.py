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
#
# Bounded repetitions as loops (`Structure(..., loops=True)`, masks/cache.py's first visits):
# - The GBNF parser unrolls `x{0,n}` into a chain of links, S(n) ::= x S(n-1) | ... S(1) ::= x | (and
#   `x?` is a chain of one link), where `x*` is the loop S ::= x S | . A structure built with `loops`
#   writes every reference to a link S(i) as the reference to the loop over the same x: the form it
#   gives a position is the form that position has in the grammar with the chain made a loop, equal to
#   the form of a real `x*` with the same continuation (the loop of any x is written alike, whichever
#   chain or loop it comes from). `stack_reach(stack)` gives these ids for a stack with its reach.
# - Reach, and why it is exact. The chain and the loop have the same paths except those that take an
#   (i+1)-th x after a link S(i): the chain's paths are the loop's, minus those. Every x matches at least
#   L >= 1 terminals (a link needs it), so such a path has matched at least `used + i*L` terminals
#   when it starts that x, where `used` is the fewest terminals matched before the reference. A token
#   of m code points that ends in an unfinished sequence of p (0 or 1) looks at m + p terminals along
#   a path: it matches m and judges the unfinished end against the next one, or is decided whole by a
#   token terminal or the escape mark met with code points left (masks/compute.py). A token that looks
#   at no more than `used + i*L` terminals therefore never tells a loop-only path from a dead one: it is
#   allowed, rejected or uncertain from the chain's stacks exactly as from the loop's. A position's reach
#   is the least such bound over the chains its form reaches (and over every place its form is cut at
#   the horizon, past which nothing is known: no token looks that far); a stack's reach counts from its
#   top, the fewest terminals of each position before the next one's: min over i of (rest(p_1) + ... +
#   rest(p_i-1) + reach(p_i)). So for every token whose piece looks at no more terminals than the
#   stack's reach, the stack's verdict is the verdict of the stack with every chain made a loop, and two
#   stacks with the same ids in this mode share it below the smaller reach; only the longer tokens need
#   a walk of their own (masks/cache.py).
# - The copies a bounded repetition must take come first, inline, before its chain (`x{m,n}` is x ... x,
#   m times, then the chain of n - m links): a position with j copies of x left before a link over the
#   same x is written, in this mode, as the loop over x with no way out (x x x ... forever), and what
#   came before it. Its paths and the loop's agree until they have taken j copies of x, at least j * L
#   terminals after `used`: the reach of that position is at most used + j * L. So every position of the
#   copies (`char{22,4096}`: 22 of them) has one form, and each borrows the verdicts its neighbours
#   learned, below its own reach, as a chain's links do.
# - A form this mode cannot write finitely, or too large to write, gets a unique id and reach 0: no
#   sharing, never a wrong one.
from __future__ import annotations

import bisect
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

__all__ = ["ESCAPE_ID", "MAX_WORK", "UNBOUNDED", "FormTable", "Structure"]

ESCAPE_ID: Final = -1
MAX_WORK: Final = 1_000  # elements written for one position's form
MAX_FORMS: Final = 500_000  # forms numbered before the table starts afresh
_BEYOND: Final = -2  # the mark where a form is cut off at the horizon
_ENDLESS: Final = -3  # the mark of a loop written with no way out (loops only: a run of x before a chain)
_TERMINAL_STARTS: Final = frozenset((CHAR, CHAR_NOT, CHAR_ANY, TOKEN, TOKEN_NOT))
_CONTINUATIONS: Final = frozenset((CHAR_ALT, CHAR_RNG_UPPER))
_ENDS: Final = frozenset((END, ALT))
_UNBOUNDED: Final = 1 << 30
UNBOUNDED: Final = _UNBOUNDED  # the reach of a stack that reaches no chain
# A rule's closure written out (`Structure._signature`): per rule reached, in the order first met, its
# elements with each rule reference's value blanked, and the order numbers of the rules they reference.
_Signature = tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
# Elements (kind and value each) at most of a closure that is written out (a larger one, a schema's own
# tree, keeps its forms to its grammar).
MAX_SIGNATURE_ELEMENTS: Final = 640
# A link of a chain (see the module comment): (x as (kind, value) pairs, where x starts, where it ends,
# links down to the end of the chain, this one included, and the fewest terminals x matches).
_Link = tuple[tuple[int, ...], int, int, int, int]


class _Cycle(Exception):
    """A rule reached itself without matching anything: its form cannot be written finitely here."""


class _TooLarge(Exception):
    """A position's form took more than MAX_WORK elements to write."""


class FormTable:
    """Numbers structural forms: equal forms, equal ids, for as long as the table keeps them."""

    __slots__ = ("_forms", "_next_id", "_rule_forms", "_signatures")

    def __init__(self) -> None:
        self._forms: dict[tuple[int, ...], int] = {}
        self._next_id = itertools.count()
        # a rule's closure written out (`Structure`'s signatures) -> its number; (that number, budget,
        # horizon, loops) -> the rule's (id, reach) written by some grammar
        self._signatures: dict[_Signature, int] = {}
        self._rule_forms: dict[tuple[int, int, int, bool], tuple[int, int]] = {}

    def number(self, form: tuple[int, ...]) -> int:
        """The id of `form`: the one given before if the table still holds it, else a new one."""
        forms = self._forms
        found = forms.get(form)
        if found is None:
            if len(forms) >= MAX_FORMS:
                forms = self._forms = {}
            found = forms.setdefault(form, next(self._next_id))
        return found

    def signature(self, closure: _Signature) -> int:
        """The number of a rule's closure as `Structure` writes it: equal closures, equal numbers."""
        signatures = self._signatures
        found = signatures.get(closure)
        if found is None:
            if len(signatures) >= MAX_FORMS:
                signatures = self._signatures = {}
                self._rule_forms = {}  # keyed by the numbers dropped
            found = signatures.setdefault(closure, next(self._next_id))
        return found

    def rule_form(self, key: tuple[int, int, int, bool]) -> tuple[int, int] | None:
        """The (id, reach) a grammar wrote for a rule with the closure numbered `key[0]`, at budget
        `key[1]`, horizon `key[2]`, in loop mode or not (`key[3]`); None if none was kept."""
        return self._rule_forms.get(key)

    def keep_rule_form(self, key: tuple[int, int, int, bool], found: tuple[int, int]) -> None:
        """Keeps what `rule_form` gives for `key`."""
        rule_forms = self._rule_forms
        if len(rule_forms) >= MAX_FORMS:
            rule_forms = self._rule_forms = {}
        rule_forms.setdefault(key, found)

    def unique(self) -> int:
        """A new id, equal to no form's and to no other `unique` id."""
        return next(self._next_id)

    def __len__(self) -> int:
        return len(self._forms)


class Structure:
    """The structural ids of one grammar's positions for one horizon, computed on first use and numbered
    by `forms`."""

    __slots__ = (
        "_bounds",
        "_busy",
        "_forms",
        "_ids",
        "_links",
        "_loop_ids",
        "_loops_of",
        "_reaches",
        "_rule_ids",
        "_signatures",
        "_work",
        "horizon",
        "loops",
        "rules",
    )

    def __init__(self, rules: Rules, horizon: int, forms: FormTable, *, loops: bool = False) -> None:
        self.rules = rules
        self.horizon = horizon
        self.loops = loops
        self._forms = forms
        self._ids: dict[int, int] = {rules.escape: ESCAPE_ID}
        # per position: its reach and the fewest terminals from it to the end of its alternate
        self._reaches: dict[int, tuple[int, int]] = {rules.escape: (_UNBOUNDED, 0)}
        # (rule, budget) -> (id, reach); (x, budget) -> (id, reach) of the loop over x (loops only)
        self._rule_ids: dict[tuple[int, int], tuple[int, int]] = {}
        self._loop_ids: dict[tuple[tuple[int, ...], int], tuple[int, int]] = {}
        self._links: dict[int, _Link | None] = {}
        self._loops_of: dict[int, _Link | None] = {}
        self._busy: set[tuple[int, int]] = set()
        # per rule: the number of its closure written out (None: too large), and each rule's own part
        self._signatures: dict[int, int | None] = {}
        # per rule: the fewest and the most terminals it matches (bounds; -1 until measured)
        n_rules = len(rules.rule_starts)
        self._bounds: tuple[list[int], list[int]] = ([-1] * n_rules, [-1] * n_rules)
        self._work = 0

    def position(self, pos: int) -> int:
        """The structural id of stack position `pos` (see the module comment)."""
        found = self._ids.get(pos)
        if found is None:
            self._work = 0
            reach, rest = 0, 0
            try:
                form, reach, rest = self._sequence(pos, self.horizon)
                found = self._forms.number((0, *form))
            except _Cycle:
                found = self._forms.unique()
                reach = rest = 0
                # the rules being written met a cycle: they would again, so they are numbered as their own
                for key in self._busy:
                    self._rule_ids[key] = (self._forms.unique(), 0)
                self._busy.clear()
            except (_TooLarge, RecursionError):
                found = self._forms.unique()
                reach = rest = 0
                self._busy.clear()  # the rules written so far are kept: the next position goes further
            self._ids[pos] = found
            self._reaches[pos] = (reach, rest)
        return found

    def stack(self, stack: tuple[int, ...]) -> tuple[int, ...]:
        """The structural ids of a stack's positions, in order."""
        position = self.position
        return tuple(position(pos) for pos in stack)

    def stack_reach(self, stack: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        """The structural ids of a stack's positions and the stack's reach (see the module comment):
        tokens looking at no more terminals than it get the verdict of any stack with these ids."""
        ids = self.stack(stack)
        reaches = self._reaches
        reach = _UNBOUNDED
        before = 0  # the fewest terminals matched before a position is reached
        for pos in reversed(stack):
            own, rest = reaches[pos]
            reach = min(reach, before + own)
            before += rest
            if before >= reach:
                break
        return ids, reach

    def _sequence(self, start: int, budget: int, loop: _Link | None = None) -> tuple[list[int], int, int]:
        # One alternate from `start` to its end, as (kind, value) pairs ending in (END, 0), or in
        # (_BEYOND, 0) where every path has matched `budget` terminals already; with its reach and the
        # fewest terminals it matches (to the cut, if cut). With `loop`, the alternate is a link's x,
        # followed by the loop over it (in place of the rest of the chain).
        kinds, values = self.rules.kinds, self.rules.values
        least = self._bounds[0]
        form: list[int] = []
        used = 0
        reach = _UNBOUNDED
        at = start
        work = self._work
        # loops only: per element begun, what was written before it (a run of copies is written over)
        begun: dict[int, tuple[int, int, int]] | None = {} if self.loops else None
        while True:
            kind = kinds[at]
            if begun is not None and kind not in _CONTINUATIONS:
                begun[at] = (len(form), used, reach)
            if kind in _CONTINUATIONS:  # the rest of a char class: part of the terminal begun
                form += (kind, values[at])
            elif used >= budget:
                form += (_BEYOND, 0)  # whatever comes next, the end of the alternate included
                reach = min(reach, used)
                break
            elif loop is not None and at == loop[2]:  # x ends: the loop goes on
                self._work = work
                found, inner = self._loop(loop, budget - used)
                work = self._work
                form += (RULE_REF, found, END, 0)
                reach = min(reach, used + inner)
                break
            elif kind == RULE_REF:
                rule = values[at]
                self._work = work
                link = self._link(rule) if self.loops else None
                copies, first = 0, at
                if begun is not None:
                    over = link if link is not None else self._loop_of(rule)
                    if over is not None and not self._inside(at, over):
                        copies, first = self._copies_before(at, start, over)
                if copies:  # j copies of x before a chain or a loop over x: the loop with no way out
                    assert begun is not None and over is not None
                    written, used, reach = begun[first]
                    del form[written:]
                    found, inner = self._loop(over, budget - used)
                    work = self._work
                    form += (_ENDLESS, found)
                    reach = min(reach, used + min(inner, copies * over[4]))
                    used += copies * over[4]
                    break
                if link is None:
                    found, inner = self._rule(rule, budget - used)  # measures the rule
                    fewest = least[rule]
                else:  # a chain, written as its loop: exact for tokens looking at up to i * L terminals more
                    found, inner = self._loop(link, budget - used)
                    inner, fewest = min(inner, link[3] * link[4]), 0  # a link can vanish
                work = self._work
                form += (RULE_REF, found)
                reach = min(reach, used + inner)
                used += fewest
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
        return form, reach, used

    def _loop_of(self, rule: int) -> _Link | None:
        # `rule` as a link over its x when it is a loop S ::= x S | (x matching at least one terminal):
        # `x{m,}` is m copies of x, then such a loop
        loops_of = self._loops_of
        if rule in loops_of:
            return loops_of[rule]
        kinds, values = self.rules.kinds, self.rules.values
        alternates = self.rules.alternates[rule]
        found: _Link | None = None
        if len(alternates) == 2 and alternates[0] >= 0 and alternates[1] < 0:
            start = end = alternates[0]
            while kinds[end] not in _ENDS:
                end += 1
            if end - 1 > start and kinds[end - 1] == RULE_REF and values[end - 1] == rule:
                fewest = self._fewest(start, end - 1)
                if fewest >= 1:
                    x = tuple(v for at in range(start, end - 1) for v in (kinds[at], values[at]))
                    found = (x, start, end - 1, 1, fewest)
        loops_of[rule] = found
        return found

    def _inside(self, at: int, over: _Link) -> bool:
        # whether `at` lies in a link or a loop over the same x as `over` (its x is the loop's own body,
        # not copies before it)
        rule = bisect.bisect_right(self.rules.rule_starts, at) - 1
        own = self._link(rule) or self._loop_of(rule)
        return own is not None and own[0] == over[0]

    def _copies_before(self, at: int, start: int, link: _Link) -> tuple[int, int]:
        # how many copies of the link's x come right before `at` (none before `start`), and where the
        # first of them begins
        kinds, values = self.rules.kinds, self.rules.values
        x = link[0]
        size = len(x) // 2
        copies = 0
        while at - size >= start and all(
            kinds[at - size + i] == x[2 * i] and values[at - size + i] == x[2 * i + 1] for i in range(size)
        ):
            copies += 1
            at -= size
        return copies, at

    def _rule(self, rule: int, budget: int) -> tuple[int, int]:
        most = self._bounds[1]
        if most[rule] < 0:
            self._measure(rule)  # the caller reads the rule's fewest terminals next
        # a loop S ::= x S | is written as the loop over its x (the same form), once per x and budget,
        # whichever rule it is: a grammar repeats `char*` in every group that says it (a key trie has
        # hundreds), and each would otherwise write a chain of forms of its own, one per budget down from
        # the horizon
        loop = self._loop_of(rule)
        if loop is not None:
            return self._loop(loop, budget)
        # a rule that matches at most m terminals is cut nowhere by a budget above m: one form for all
        if budget > most[rule] + 1:
            budget = most[rule] + 1
        key = (rule, budget)
        found = self._rule_ids.get(key)
        if found is None:
            # a rule whose closure another grammar (or another rule of this one) has alike, written there
            # at this budget: the same form, the same verdicts (the value, object and array rules every
            # schema with a free-form value repeats, written once per vocabulary, not once per grammar)
            # (only a rule that may match up to the horizon: it alone has a form for each budget below;
            # any other has one or a few, cheaper to write than its closure; and no link of a chain,
            # whose closure is the rest of the chain, written a link at a time)
            signature = None
            if most[rule] >= self.horizon and self._link(rule) is None:
                signature = self._signature(rule)
            shared = None if signature is None else (signature, budget, self.horizon, self.loops)
            if shared is not None:
                found = self._forms.rule_form(shared)
                if found is not None:
                    self._rule_ids[key] = found
                    return found
            if key in self._busy:
                raise _Cycle
            self._busy.add(key)
            form: list[int] = [1]
            reach = _UNBOUNDED
            for start in self.rules.alternates[rule]:
                if start < 0:
                    form += (END, 0)
                else:
                    written, inner, _ = self._sequence(start, budget)
                    form += written
                    reach = min(reach, inner)
            self._busy.discard(key)
            found = self._rule_ids[key] = (self._forms.number(tuple(form)), reach)
            if shared is not None:
                self._forms.keep_rule_form(shared, found)
        return found

    def _signature(self, rule: int) -> int | None:
        # The number of `rule`'s closure written out (`_Signature`): two rules with equal closures match
        # alike, whatever grammar and rule ids they have, so they have equal forms at every budget. None
        # when the closure takes more than MAX_SIGNATURE_ELEMENTS to write, or holds a rule known to (a
        # closure holds each of its rules' closures).
        signatures = self._signatures
        if rule in signatures:
            return signatures[rule]
        kinds, values = self.rules.kinds, self.rules.values
        starts, end_of_all = self.rules.rule_starts, self.rules.escape
        order = [rule]
        index = {rule: 0}
        parts: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        found: int | None = None
        written = 0
        for at_rule in order:  # grows while it is read: breadth first
            start = starts[at_rule]
            end = starts[at_rule + 1] if at_rule + 1 < len(starts) else end_of_all
            elements: list[int] = []
            references: list[int] = []
            for at in range(start, end):
                kind, value = kinds[at], values[at]
                if kind == RULE_REF:
                    if value in signatures and signatures[value] is None:
                        break
                    number = index.get(value)
                    if number is None:
                        number = index[value] = len(order)
                        order.append(value)
                    references.append(number)
                    value = 0
                elements += (kind, value)
            else:
                parts.append((tuple(elements), tuple(references)))
                written += len(elements)
                if written <= MAX_SIGNATURE_ELEMENTS:
                    continue
            break
        else:
            found = self._forms.signature(tuple(parts))
        signatures[rule] = found
        return found

    def _loop(self, link: _Link, budget: int) -> tuple[int, int]:
        # The loop over a link's x (S ::= x S | ), written as `_rule` writes a real one: x, then the loop
        # with the budget x leaves, then the empty alternate. Its reach is that of what x reaches (a loop
        # is never exhausted). A real loop's budget is never clamped (it matches up to the horizon).
        key = (link[0], budget)
        found = self._loop_ids.get(key)
        if found is None:
            written, reach, _ = self._sequence(link[1], budget, link)
            found = self._loop_ids[key] = (self._forms.number((1, *written, END, 0)), reach)
        return found

    def _link(self, rule: int) -> _Link | None:
        # Whether `rule` is a link of a chain (see the module comment), found down the chain without
        # recursion (chains run thousands of links deep): S ::= x S' | where S' is a link over the same
        # x, or S ::= x | . A rule whose x can match nothing is no link, nor is a rule on a cycle of them.
        links = self._links
        if rule in links:
            return links[rule]
        kinds, values = self.rules.kinds, self.rules.values
        path: list[tuple[int, int, int]] = []  # (rule, x's start, x's end with the trailing reference)
        seen: set[int] = set()
        below: _Link | None = None
        at_rule = rule
        while True:
            if at_rule in links:
                below = links[at_rule]
                break
            alternates = self.rules.alternates[at_rule]
            if at_rule in seen:  # a loop, or a cycle of rules: none of them is a link
                for on_path, _, _ in path:
                    links[on_path] = None
                return None
            if len(alternates) != 2 or alternates[0] < 0 or alternates[1] >= 0:
                links[at_rule] = below = None
                break
            seen.add(at_rule)
            start = end = alternates[0]
            while kinds[end] not in _ENDS:
                end += 1
            path.append((at_rule, start, end))
            if kinds[end - 1] != RULE_REF:
                below = None
                break
            at_rule = values[end - 1]
        for at_rule, start, end in reversed(path):
            whole = tuple(v for at in range(start, end) for v in (kinds[at], values[at]))
            if below is not None and end - 1 > start and below[0] == whole[:-2]:
                link: _Link | None = (below[0], start, end - 1, below[3] + 1, below[4])
            else:
                fewest = self._fewest(start, end)
                link = (whole, start, end, 1, fewest) if fewest >= 1 else None
            links[at_rule] = below = link
        return links[rule]

    def _fewest(self, start: int, end: int) -> int:
        # the fewest terminals the elements from `start` to `end` match
        kinds, values = self.rules.kinds, self.rules.values
        count = 0
        for at in range(start, end):
            if kinds[at] == RULE_REF:
                count += self.bounds(values[at])[0]
            elif kinds[at] in _TERMINAL_STARTS:
                count += 1
        return count

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
