# The keys of an object with patternProperties, split by the patterns they match: a deterministic automaton
# over the patterns (ECMA-262 as schema/ecma_patterns.py reads them) and the declared names, for the extended
# dialect (schema/extended.py).
#
# Contract:
# - `KeyAutomaton(patterns, names)` reads every pattern (`Unsupported` where ecma_patterns does not, or the
#   automaton grows past MAX_STATES) and answers, for each set of patterns a key may match (its label;
#   the empty set: none of them), whether some key that is none of `names` has it (`labels`), and writes the
#   GBNF of exactly those keys (`key_rules`): JSON strings, quotes included, each character in its JSON
#   spelling (raw, or escaped where JSON must escape it, as `_spelled` writes it), so a key spelled with
#   another escape (`\u0061` for `a`) is taken by no label's rule. `label_of(name)` is a name's label.
# - Matching is ECMA-262's search: a pattern without `^` may start anywhere, one without `$` end anywhere.
# Invariants: states are reachable from the start; the automaton is built once and read, never changed.
from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Final

from constraintd.engine.schema.ecma_patterns import (  # the parser's tree, read here too
    _MAX_CHAR,
    Unsupported,
    _Alt,
    _Anchor,
    _branches,
    _Chars,
    _flat,
    _intersect,
    _Node,
    _Parser,
    _Repeat,
    _Seq,
    _spelled,
)

__all__ = ["MAX_STATES", "KeyAutomaton"]

MAX_STATES: Final = 400  # states of the automaton, at most
_MAX_NFA: Final = 4000  # states of a pattern's NFA (counted repetitions copied), at most
_EVERY: Final = ((0, _MAX_CHAR),)
_NO_SURROGATES: Final = ((0, 0xD7FF), (0xE000, _MAX_CHAR))  # a JSON key's text holds none alone


class _Nfa:
    """Thompson's construction over character ranges; state 0 starts, `accept` ends."""

    def __init__(self) -> None:
        self.moves: list[list[tuple[tuple[tuple[int, int], ...], int]]] = []
        self.empty: list[list[int]] = []
        self.accept = 0

    def state(self) -> int:
        if len(self.moves) >= _MAX_NFA:
            raise Unsupported("a pattern too large for the key automaton")
        self.moves.append([])
        self.empty.append([])
        return len(self.moves) - 1

    def build(self, node: _Node, start: int) -> int:
        """The state after `node`, from `start`."""
        if isinstance(node, _Chars):
            end = self.state()
            self.moves[start].append((node.ranges, end))
            return end
        if isinstance(node, _Seq):
            for item in node.items:
                start = self.build(item, start)
            return start
        if isinstance(node, _Alt):
            end = self.state()
            for branch in node.branches:
                here = self.state()
                self.empty[start].append(here)
                self.empty[self.build(branch, here)].append(end)
            return end
        if isinstance(node, _Repeat):
            for _ in range(node.low):
                start = self.build(node.item, start)
            if node.high is None:
                loop = self.state()
                self.empty[start].append(loop)
                self.empty[self.build(node.item, loop)].append(loop)
                return loop
            end = self.state()
            self.empty[start].append(end)
            for _ in range(node.high - node.low):
                start = self.build(node.item, start)
                self.empty[start].append(end)
            return end
        raise Unsupported("an anchor inside the pattern")

    def closure(self, states: frozenset[int]) -> frozenset[int]:
        seen = set(states)
        pending = list(states)
        while pending:
            for target in self.empty[pending.pop()]:
                if target not in seen:
                    seen.add(target)
                    pending.append(target)
        return frozenset(seen)


def _pattern_nfa(pattern: str) -> _Nfa:
    parser = _Parser(pattern)
    root = parser.alternatives()
    if parser.i != len(pattern):
        raise Unsupported("unbalanced parentheses")
    nfa = _Nfa()
    start = nfa.state()
    nfa.accept = nfa.state()
    for branch in _branches(root):
        items = _flat(branch.items)
        anchored_start = bool(items) and items[0] == _Anchor(True)
        anchored_end = bool(items) and items[-1] == _Anchor(False)
        body = items[int(anchored_start): len(items) - int(anchored_end)]
        here = nfa.state()
        nfa.empty[start].append(here)
        if not anchored_start:  # any text before it
            nfa.moves[here].append((_EVERY, here))
        end = nfa.build(_Seq(tuple(body)), here)
        if not anchored_end:  # any text after it
            nfa.moves[end].append((_EVERY, end))
        nfa.empty[end].append(nfa.accept)
    return nfa


def _names_nfa(names: Sequence[str]) -> _Nfa:
    nfa = _Nfa()
    nfa.state()
    nfa.accept = nfa.state()
    for name in names:
        node = _Seq(tuple(_Chars(((ord(char), ord(char)),)) for char in name))
        nfa.empty[nfa.build(node, 0)].append(nfa.accept)
    return nfa


def _atoms(nfas: Sequence[_Nfa]) -> list[tuple[int, int]]:
    # the code points cut where any range starts or ends: each atom moves every NFA alike
    cuts = {0, _MAX_CHAR + 1}
    for nfa in nfas:
        for moves in nfa.moves:
            for ranges, _ in moves:
                for low, high in ranges:
                    cuts.update((low, high + 1))
    points = sorted(cuts)
    return [(low, high - 1) for low, high in itertools.pairwise(points)]


class KeyAutomaton:
    """The keys of an object split by the patterns they match (see the module comment)."""

    def __init__(self, patterns: Sequence[str], names: Sequence[str]) -> None:
        self.nfas = [_pattern_nfa(pattern) for pattern in patterns] + [_names_nfa(names)]
        self.atoms = _atoms(self.nfas)
        start = tuple(nfa.closure(frozenset({0})) for nfa in self.nfas)
        self.states: list[tuple[frozenset[int], ...]] = [start]
        index = {start: 0}
        # moves[state]: target state -> the atoms' ranges that lead there
        self.moves: list[dict[int, list[tuple[int, int]]]] = []
        i = 0
        while i < len(self.states):
            state = self.states[i]
            targets: dict[int, list[tuple[int, int]]] = {}
            for atom in self.atoms:
                after = tuple(nfa.closure(frozenset(target for source in part for ranges, target in
                                                    nfa.moves[source] if _covers(ranges, atom)))
                              for nfa, part in zip(self.nfas, state, strict=True))
                if after not in index:
                    if len(self.states) >= MAX_STATES:
                        raise Unsupported("the key automaton grows past its bound")
                    index[after] = len(self.states)
                    self.states.append(after)
                targets.setdefault(index[after], []).append(atom)
            self.moves.append(targets)
            i += 1

    def _label(self, state: int) -> frozenset[int] | None:
        """The patterns a key ending in `state` matches; None for a declared name."""
        parts = self.states[state]
        if self.nfas[-1].accept in parts[-1]:
            return None
        return frozenset(i for i, (nfa, part) in enumerate(zip(self.nfas[:-1], parts, strict=False))
                         if nfa.accept in part)

    def labels(self) -> set[frozenset[int]]:
        """The labels of the keys that are none of the names."""
        return {label for state in range(len(self.states)) if (label := self._label(state)) is not None}

    def label_of(self, name: str) -> frozenset[int]:
        """The patterns `name` matches."""
        parts = tuple(nfa.closure(frozenset({0})) for nfa in self.nfas[:-1])
        for char in name:
            code = ord(char)
            parts = tuple(nfa.closure(frozenset(target for source in part for ranges, target in
                                                nfa.moves[source] if _covers(ranges, (code, code))))
                          for nfa, part in zip(self.nfas, parts, strict=False))
        return frozenset(i for i, (nfa, part) in enumerate(zip(self.nfas, parts, strict=False))
                         if nfa.accept in part)

    def key_rules(self, label: frozenset[int], add_rule: Callable[[str, str], str],
                  fresh: Callable[[Sequence[str]], bool], base: str) -> str:
        """The GBNF expression of the keys (quotes included) of `label` that are none of the names. Its
        rules are named `base`-N, with a number added to `base` until `fresh` says none of them exists."""
        ends = {state for state in range(len(self.states)) if self._label(state) == label}
        # the states from which such a key can still end
        alive = set(ends)
        changed = True
        while changed:
            changed = False
            for state, targets in enumerate(self.moves):
                if state not in alive and alive.intersection(targets):
                    alive.add(state)
                    changed = True
        if 0 not in alive:
            raise Unsupported("no key of this label")
        order = sorted(alive)
        for attempt in range(1000):
            prefix = f"{base}{attempt or ''}"
            names = {state: f"{prefix}-{state}" for state in order}
            if fresh(list(names.values())):
                break
        else:
            raise Unsupported("no free rule names")
        for state in order:
            alternatives = []
            for target, ranges in sorted(self.moves[state].items()):
                chars = _intersect(tuple(ranges), _NO_SURROGATES)
                if target in alive and chars:
                    alternatives.append(f"{_spelled(chars)} {names[target]}")
            if state in ends:
                alternatives.insert(0, '""')
            given = add_rule(names[state], " | ".join(alternatives))
            assert given == names[state]
        return f'"\\"" {names[0]} "\\""'


def _covers(ranges: Sequence[tuple[int, int]], atom: tuple[int, int]) -> bool:
    return any(low <= atom[0] and atom[1] <= high for low, high in ranges)
