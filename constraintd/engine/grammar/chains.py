# The positions of a bounded repetition that no token can tell apart: one mask serves them all.
#
# Contract:
# - llama.cpp's parser unrolls `S{m,n}` into a chain of rules (gbnf.py's `repeat`): S'(1) ::= S |, and
#   S'(k) ::= S S'(k-1) |. A stack position at offset o of S'(k)'s first alternate offers at most k more
#   repetitions of S, the one it is in included. `bounded_chains` finds every rule of that shape in a
#   flattened grammar (by its form, whoever wrote it) whose S cannot match nothing, with its depth k.
# - Since S takes at least one code point (or one token, for a token terminal) per repetition, a token of
#   at most L code points goes through at most L repetitions, and then looks at one more terminal (to
#   judge an unfinished UTF-8 sequence, or to see which stacks live on). So, for every such token, a
#   position of S'(k) and the position at the same offset of S'(h) in the same chain lead to the same
#   stacks, rule for rule, when k and h both exceed L + 1: llama.cpp's apply allows the same tokens from a
#   stack set as from the set with one replaced by the other.
# - `ChainAliases(rules, horizon)` maps each position of S'(k), k > horizon, to its offset in S'(horizon),
#   and leaves every other position as it is. With `horizon` at least the longest token's code points + 2,
#   `same_stacks` of a stack set has the mask of the set itself (masks/cache.py): the masks of a string's
#   first characters under a long `maxLength` (`char{0,255}`, unrolled into 255 rules) are one mask,
#   where each position was a state of its own, composed anew.
# - Only a stack's plain positions are replaced, not those folded into its Tail (stacks.py): any subset of
#   the replacements gives the same mask, as each one does.
from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Final

from constraintd.engine.grammar.elements import ALT, END, RULE_REF
from constraintd.engine.grammar.stacks import TERMINAL_KINDS, Rules, Stack, StackSet, Tail

__all__ = ["ChainAliases", "bounded_chains", "takes_input"]

_END_OF_SEQUENCE: Final = frozenset((END, ALT))


def bounded_chains(rules: Rules) -> tuple[dict[int, int], dict[int, int]]:
    """The chain rules of `rules` (see the module comment): per rule, its depth k (S'(1) is 1), and per
    rule of depth 2 or more, the rule one repetition shorter it ends with."""
    kinds, values = rules.kinds, rules.values
    depth: dict[int, int] = {}
    shorter: dict[int, int] = {}
    bodies: dict[int, tuple[int, int]] = {}  # a chain rule -> its first alternate's (start, end)
    for rule, alternates in enumerate(rules.alternates):
        if len(alternates) != 2 or alternates[0] < 0 or alternates[1] >= 0:
            continue  # not `A |`
        start = end = alternates[0]
        while kinds[end] not in _END_OF_SEQUENCE:
            end += 1
        last = end - 1
        inner = values[last] if kinds[last] == RULE_REF else -1
        if inner == rule:
            continue  # S' ::= S S' |, an unbounded repetition
        # S'(k) ::= S S'(k-1) | where S'(k-1) is a chain rule already found (the parser numbers S'(1)
        # first) with S as its own repetition
        below = bodies.get(inner)
        if below is not None:
            s_end = below[1] - 1 if depth[inner] > 1 else below[1]
            if _same(rules, start, last, below[0], s_end):
                depth[rule] = depth[inner] + 1
                shorter[rule] = inner
                bodies[rule] = (start, end)
                continue
        # else S'(1) ::= S |, its whole first alternate the repetition
        if takes_input(rules, range(start, end)):
            depth[rule] = 1
            bodies[rule] = (start, end)
    return depth, shorter


def _same(rules: Rules, start: int, end: int, other: int, other_end: int) -> bool:
    # whether the elements [start, end) and [other, other_end) are the same
    if end - start != other_end - other:
        return False
    kinds, values = rules.kinds, rules.values
    return kinds[start:end] == kinds[other:other_end] and values[start:end] == values[other:other_end]


def takes_input(rules: Rules, positions: Iterable[int]) -> bool:
    """Whether the elements at `positions` (a sequence) surely take a code point or a token: one is a
    terminal, or refers to a rule every alternate of which starts with one. A cautious answer: False
    only costs a shortcut."""
    kinds, values = rules.kinds, rules.values
    for pos in positions:
        kind = kinds[pos]
        if kind in TERMINAL_KINDS:
            return True
        if kind == RULE_REF and all(
            start >= 0 and kinds[start] in TERMINAL_KINDS for start in rules.alternates[values[pos]]
        ):
            return True
    return False


class ChainAliases:
    """Each position of a chain rule deeper than `horizon` mapped to its offset in the chain's rule of
    depth `horizon` (see the module comment). `active` is False when the grammar has no such position."""

    __slots__ = ("_alias", "active")

    def __init__(self, rules: Rules, horizon: int) -> None:
        depth, shorter = bounded_chains(rules)
        # the rule of depth `horizon` each deeper rule maps to, found from the one below it (numbered
        # before it, as the parser makes them; a rule whose shorter one comes after it is left alone)
        anchor: dict[int, int] = {}
        for rule in sorted(depth):
            k = depth[rule]
            if k == horizon:
                anchor[rule] = rule
            elif k > horizon and shorter[rule] in anchor:
                anchor[rule] = anchor[shorter[rule]]
        self.active = any(rule != target for rule, target in anchor.items())
        alias = array("i")
        if self.active:
            alias = array("i", range(len(rules.kinds)))
            starts = rules.rule_starts
            for rule, target in anchor.items():
                if rule != target:
                    start, to = starts[rule], starts[target]
                    end = start
                    while rules.kinds[end] not in _END_OF_SEQUENCE:
                        alias[end] = to + end - start
                        end += 1
        self._alias = alias

    @property
    def nbytes(self) -> int:
        """Bytes of the table (4 a grammar position when active)."""
        return self._alias.itemsize * len(self._alias)

    def same_stack(self, stack: Stack) -> Stack:
        """`stack` with its plain positions aliased (the stack itself when none is)."""
        alias = self._alias
        folded = 1 if stack and isinstance(stack[0], Tail) else 0
        moved = tuple([alias[pos] for pos in stack[folded:]])
        if moved == stack[folded:]:
            return stack
        return (*stack[:folded], *moved)

    def same_stacks(self, stacks: StackSet) -> list[Stack] | None:
        """The stacks with their positions aliased, or None when no position is."""
        moved = [self.same_stack(stack) for stack in stacks]
        if all(a is b for a, b in zip(moved, stacks, strict=True)):
            return None
        return moved
