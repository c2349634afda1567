# llama.cpp's multi-pattern matcher (common/trie.cpp: `common_trie` and `common_aho_corasick`), over symbols
# that are plain ints: code points where the chat layer builds a grammar that excludes strings, token ids
# where the reasoning budget watches for its start and end sequences.
#
# Contract (as llama.cpp's):
# - States are the trie's nodes in insertion order (0 the root); a pattern's index is the order it was first
#   inserted (a duplicate keeps the first index).
# - Failure links are computed breadth first, a node's children visited by ascending symbol (llama.cpp keeps
#   them in a std::map); `match[s]` is the longest pattern that ends at s, directly or through its links.
# - `next` follows failure links until a transition on the symbol exists, and answers the root where none
#   does: a symbol outside the alphabet sends every state back to 0.
from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["AhoCorasick"]


class AhoCorasick:
    """common_aho_corasick over int symbols."""

    __slots__ = ("alphabet", "children", "fail", "match", "pattern")

    def __init__(self, patterns: Iterable[Sequence[int]]) -> None:
        self.children: list[dict[int, int]] = [{}]
        self.pattern: list[int] = [-1]  # the pattern ending at each node (not through links), -1 if none
        count = 0
        for symbols in patterns:
            node = 0
            for symbol in symbols:
                child = self.children[node].get(symbol)
                if child is None:
                    child = len(self.children)
                    self.children.append({})
                    self.pattern.append(-1)
                    self.children[node][symbol] = child
                node = child
            if self.pattern[node] < 0:
                self.pattern[node] = count
                count += 1
        n = len(self.children)
        self.fail: list[int] = [0] * n
        order: list[int] = []
        queue = [0]
        while queue:
            u = queue.pop(0)
            order.append(u)
            for symbol, v in sorted(self.children[u].items()):
                if u != 0:
                    f = self.fail[u]
                    while f and symbol not in self.children[f]:
                        f = self.fail[f]
                    target = self.children[f].get(symbol)
                    self.fail[v] = target if target is not None and target != v else 0
                queue.append(v)
        self.match: list[int] = [-1] * n
        for u in order:
            own = self.pattern[u]
            self.match[u] = own if own >= 0 else (self.match[self.fail[u]] if u != 0 else -1)
        self.alphabet: list[int] = sorted({symbol for node in self.children for symbol in node})

    def next(self, state: int, symbol: int) -> int:
        """The state after `symbol` from `state`."""
        while state and symbol not in self.children[state]:
            state = self.fail[state]
        return self.children[state].get(symbol, 0)

    def terminal(self, state: int) -> bool:
        """Whether a pattern ends at `state`."""
        return self.match[state] >= 0
