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
#   and `advance` reads only the bytes appended since (and the last few again), so an accept while a
#   grammar waits costs its piece's length times the patterns' size, however long the buffer has grown.
#   `MAX_PROGRAM` bounds the size of the patterns together.
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from constraintd.engine.grammar.trigger_regex import MAX_PROGRAM, Captures, Program, Scan
from constraintd.errors import GrammarError

__all__ = ["BufferedToken", "TriggerPattern", "TriggerScan", "Triggers"]

# (token id, start, end) of a buffered piece in the buffer
BufferedToken = tuple[int, int, int]
# per pattern: its search, and its whole-buffer match (None unless written ^...$)
TriggerScan = tuple[tuple[Scan, Scan | None], ...]
_NO_SCAN: Final[TriggerScan] = ()


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

    patterns: tuple[TriggerPattern, ...]
    tokens: frozenset[int]

    @classmethod
    def compile(cls, patterns: Sequence[str], tokens: Sequence[int]) -> Triggers:
        """Compile the patterns.

        Raises:
            GrammarError: a pattern cannot be compiled, or the patterns together are too large.
        """
        compiled = tuple(TriggerPattern.compile(p) for p in patterns)
        size = sum(len(p.program.code) for p in compiled)
        if size > MAX_PROGRAM:
            raise GrammarError(f"trigger patterns compile to {size} instructions, over {MAX_PROGRAM}")
        return cls(compiled, frozenset(int(t) for t in tokens))

    def start(self) -> TriggerScan:
        """The scan of an empty buffer."""
        return tuple(pattern.start() for pattern in self.patterns) if self.patterns else _NO_SCAN

    def advance(self, scan: TriggerScan, buffer: bytes | bytearray) -> tuple[TriggerScan, int]:
        """`scan` taken over what was appended to `buffer` since, and where the first pattern that matches
        `buffer` puts the start of the constrained text (-1: none matches)."""
        scans = []
        for pattern, each in zip(self.patterns, scan, strict=True):
            moved, start = pattern.advance(each, buffer)
            if start >= 0:
                return scan, start
            scans.append(moved)
        return tuple(scans), -1

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
