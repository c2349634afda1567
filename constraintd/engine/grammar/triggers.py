# Lazy grammars: unconstrained until a trigger token or a trigger pattern, as llama_grammar_accept_impl.
#
# Contract:
# - While a lazy grammar awaits its trigger every token is allowed (llama.cpp's apply returns at once)
#   and accepted tokens are buffered: their ids, and their pieces appended to one byte buffer.
# - A trigger token ends the wait: the buffer is dropped and that token is accepted by the grammar.
# - Otherwise, after each buffered token, each pattern in order is looked for in the whole buffer
#   (llama_grammar_trigger_pattern::find); at the first that matches, the wait ends and every buffered
#   token that reaches past the match start is replayed into the grammar, the first one cut to start
#   there (`Triggers.replayed`).
# - Patterns are ECMAScript regular expressions over bytes (std::regex on a std::string). `find` follows
#   llama.cpp: a pattern written `^...$` is first matched against the whole buffer (std::regex_match),
#   and every pattern is then searched anywhere (std::regex_search); the start is that of the first
#   capture group that matched something, else that of the whole match.
# - The patterns run as automata (grammar/trigger_regex.py: no backtracking, the constructs refused
#   there are refused here), and incrementally: a `TriggerScan` holds where each pattern's search stands,
#   and `advance` reads only the bytes appended since (and the last few again), however long the buffer
#   has grown.
# - A pattern that is a plain literal (a trigger word as llama-server escapes it: one per tool name in
#   some chat formats, so hundreds) is not a program of its own: the literals together are one
#   Aho-Corasick automaton over bytes (`_Literals`), whose step costs the same for one word or a thousand.
#   Its answer is the same: among the patterns that match, the first in order wins, and a literal's match
#   starts at its leftmost occurrence (no literal matched before the bytes just appended, or the wait
#   would have ended). So an accept while a grammar waits costs its piece's length times the size of the
#   patterns that are not literals. `MAX_PROGRAM` bounds those together; `MAX_LITERAL_BYTES` the literals.
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from constraintd.engine.aho_corasick import AhoCorasick
from constraintd.engine.grammar.trigger_regex import MAX_PROGRAM, Captures, Program, Scan
from constraintd.errors import GrammarError

__all__ = ["MAX_LITERAL_BYTES", "BufferedToken", "TriggerPattern", "TriggerScan", "Triggers", "literal_of"]

# (token id, start, end) of a buffered piece in the buffer
BufferedToken = tuple[int, int, int]
# the literals' automaton state and the bytes it has read; per other pattern, its search and its
# whole-buffer match (None unless written ^...$)
TriggerScan = tuple[int, int, tuple[tuple[Scan, Scan | None], ...]]
MAX_LITERAL_BYTES: Final = 1 << 20  # the literal patterns' bytes together (their automaton's states)
# what a backslash makes literal (an identity escape), and what is not literal unescaped
_ESCAPABLE: Final = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_SPECIAL: Final = frozenset(".^$|()*+?[]{}\\")


def literal_of(pattern: str) -> bytes | None:
    """The bytes `pattern` matches if it is a plain literal (characters and escaped punctuation, as
    llama.cpp's regex_escape writes a word), else None (the empty pattern included)."""
    chars: list[str] = []
    at = 0
    while at < len(pattern):
        char = pattern[at]
        if char == "\\":
            if at + 1 < len(pattern) and pattern[at + 1] in _ESCAPABLE:
                chars.append(pattern[at + 1])
                at += 2
                continue
            return None
        if char in _SPECIAL:
            return None
        chars.append(char)
        at += 1
    return "".join(chars).encode() or None


class _Literals:
    """The literal patterns as one Aho-Corasick automaton over bytes (aho_corasick.py): after each byte,
    the first pattern in order that ends there, through its links (`found`)."""

    __slots__ = ("automaton", "found", "size")

    def __init__(self, literals: Sequence[tuple[int, bytes]]) -> None:
        # literals: (the pattern's index among all patterns, its bytes), in that order; a repeated literal's
        # first index wins, and the automaton numbers the distinct ones in the same order
        first: dict[bytes, int] = {}
        for index, word in literals:
            first.setdefault(word, index)
        self.automaton = automaton = AhoCorasick(first)
        ends = [(index, len(word)) for word, index in first.items()]
        self.size = sum(map(len, first))
        # `found`, breadth first (a node's failure link is shallower): its own pattern or its link's, the
        # one first in order
        self.found: list[tuple[int, int] | None] = [None] * len(automaton.children)
        queue = [0]
        for node in queue:
            own = automaton.pattern[node]
            mine = ends[own] if own >= 0 else None
            linked = self.found[automaton.fail[node]] if node else None
            if linked is not None and (mine is None or linked[0] < mine[0]):
                mine = linked
            self.found[node] = mine
            queue.extend(automaton.children[node].values())

    def advance(self, state: int, data: bytes | bytearray, begin: int) -> tuple[int, int, int]:
        """The state after `data[begin:]`, and the first pattern in order with an occurrence in it and
        where that occurrence starts ((-1, -1) when none)."""
        children, fail, found = self.automaton.children, self.automaton.fail, self.found
        best, start = -1, -1
        for at in range(begin, len(data)):
            byte = data[at]
            while state and byte not in children[state]:
                state = fail[state]
            state = children[state].get(byte, 0)
            here = found[state]
            if here is not None and (best < 0 or here[0] < best):
                best, start = here[0], at + 1 - here[1]
        return state, best, start


def _start_of(captures: Captures) -> int:
    # the first group that matched something, else the whole match (find_start_pos)
    for group in range(2, len(captures), 2):
        start, end = captures[group], captures[group + 1]
        if start >= 0 and end > start:
            return start
    return captures[0]


@dataclass(frozen=True, slots=True)
class TriggerPattern:
    """One trigger pattern, compiled.

    Attributes:
        pattern: the ECMAScript pattern as given.
        program: its automaton.
        whole: whether it is written `^...$` (then first matched against the whole buffer).
    """

    pattern: str
    program: Program
    whole: bool

    @classmethod
    def compile(cls, pattern: str) -> TriggerPattern:
        """Compile an ECMAScript trigger pattern.

        Raises:
            GrammarError: the pattern is not a regular expression, or uses a construct not supported.
        """
        whole = pattern.startswith("^") and pattern.endswith("$")
        return cls(pattern, Program.compile(pattern), whole)

    def start(self) -> tuple[Scan, Scan | None]:
        program = self.program
        return program.start(anchored=False), program.start(anchored=True) if self.whole else None

    def advance(
        self, scan: tuple[Scan, Scan | None], data: bytes | bytearray
    ) -> tuple[tuple[Scan, Scan | None], int]:
        """`scan` taken over what was appended to `data`, and where the constrained text starts in `data`
        (-1 when the pattern does not match it)."""
        search, whole = scan
        start = -1
        if whole is not None:
            whole, captures = self.program.advance(whole, data, anchored=True)
            if captures is not None:
                start = _start_of(captures)
        search, captures = self.program.advance(search, data, anchored=False)
        if start < 0 and captures is not None:
            start = _start_of(captures)
        return (search, whole), start

    def find(self, buffer: bytes) -> int:
        """Where the constrained text starts in `buffer`, or -1 when the pattern does not match."""
        return self.advance(self.start(), buffer)[1]


@dataclass(frozen=True, slots=True)
class Triggers:
    """What ends a lazy grammar's wait."""

    patterns: tuple[TriggerPattern, ...]  # the patterns that are no literal, in order
    order: tuple[int, ...]  # each one's index among all the patterns given
    literals: _Literals | None  # the literal patterns, one automaton
    tokens: frozenset[int]

    @classmethod
    def compile(cls, patterns: Sequence[str], tokens: Sequence[int]) -> Triggers:
        """Compile the patterns.

        Raises:
            GrammarError: a pattern cannot be compiled, or the patterns together are too large.
        """
        literals: list[tuple[int, bytes]] = []
        compiled: list[TriggerPattern] = []
        order: list[int] = []
        for index, pattern in enumerate(patterns):
            word = literal_of(pattern)
            if word is not None:
                literals.append((index, word))
            else:
                compiled.append(TriggerPattern.compile(pattern))
                order.append(index)
        size = sum(len(p.program.code) for p in compiled)
        if size > MAX_PROGRAM:
            raise GrammarError(f"trigger patterns compile to {size} instructions, over {MAX_PROGRAM}")
        words = _Literals(literals) if literals else None
        if words is not None and words.size > MAX_LITERAL_BYTES:
            raise GrammarError(f"trigger patterns hold {words.size} literal bytes, over {MAX_LITERAL_BYTES}")
        return cls(tuple(compiled), tuple(order), words, frozenset(int(t) for t in tokens))

    def start(self) -> TriggerScan:
        """The scan of an empty buffer."""
        return 0, 0, tuple(pattern.start() for pattern in self.patterns)

    def advance(self, scan: TriggerScan, buffer: bytes | bytearray) -> tuple[TriggerScan, int]:
        """`scan` taken over what was appended to `buffer` since, and where the first pattern that matches
        `buffer` puts the start of the constrained text (-1: none matches)."""
        state, read, searches = scan
        first, found = -1, -1  # the first literal in order that matches, and its start
        if self.literals is not None:
            state, first, found = self.literals.advance(state, buffer, read)
        scans = []
        for index, pattern, each in zip(self.order, self.patterns, searches, strict=True):
            if 0 <= first < index:
                return scan, found  # a literal before this pattern matches
            moved, start = pattern.advance(each, buffer)
            if start >= 0:
                return scan, start
            scans.append(moved)
        if first >= 0:
            return scan, found
        return (state, len(buffer), tuple(scans)), -1

    @staticmethod
    def replayed(
        buffer: bytes | bytearray, buffered: Sequence[BufferedToken], start: int
    ) -> list[tuple[int, bytes]]:
        """The (token, piece) pairs to replay when the constrained text starts at `start` of `buffer`."""
        # the buffered tokens are in order: find the first that ends past `start` by bisection
        low, high = 0, len(buffered)
        while low < high:
            middle = (low + high) // 2
            if buffered[middle][2] > start:
                high = middle
            else:
                low = middle + 1
        return [(token, bytes(buffer[max(begin, start) : end])) for token, begin, end in buffered[low:]]

    def replay(self, buffer: bytes, buffered: Sequence[BufferedToken]) -> list[tuple[int, bytes]] | None:
        """The (token, piece) pairs to replay if a pattern now matches `buffer`, else None (read from the
        start: a matcher advances a `TriggerScan` instead)."""
        start = self.advance(self.start(), buffer)[1]
        return None if start < 0 else self.replayed(buffer, buffered, start)
