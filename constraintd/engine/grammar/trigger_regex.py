# Trigger patterns as automata: ECMAScript regular expressions over bytes, matched without backtracking.
#
# Contract:
# - `Program.compile` parses the ECMAScript subset llama.cpp's chat templates use (literals, classes,
#   `.`, `\d\D\s\S\w\W`, groups, `(?:`, alternation, greedy and lazy `* + ? {n} {n,} {n,m}`, `^`, `$`,
#   `\b`, `\B`, and `(?=`/`(?!` of bounded length) into a Pike VM program, and refuses the rest with a
#   GrammarError: back-references, lookbehind, named groups, `\u`/`\c`, `[]`/`[^]`, a lookahead of
#   unbounded length, a program over `MAX_PROGRAM` instructions (a repetition count is expanded).
# - Matching is std::regex's with ECMAScript's leftmost-first priority (libstdc++ runs it as a
#   backtracking search): a thread list in priority order, one step per byte, so it costs
#   O(bytes x program) whatever the pattern (`(x+x+)+y` included), where backtracking is exponential.
#   The captures are those of the highest-priority match; they are not reset between iterations of a
#   repeated group (as libstdc++, and Python's `re`). Where a loop body can match empty, which path
#   counts first may differ from backtracking's (the first visit of a state at a position wins).
# - Incremental: a `Scan` is the state after some prefix of the text; `advance` takes it over the text
#   appended since, so the buffer of a waiting lazy grammar is read once, never again per token. An
#   assertion at a position needs the bytes after it (`\b`, `$`: one; a lookahead: its longest match),
#   so a scan keeps up to `lag` bytes unconsumed, and each look at the end of the text runs the last of
#   them again, knowing they end the text. What was consumed never depends on where the text ends.
# - Bytes are unsigned (0-255); `.` matches every byte but "\n" and "\r"; `\s` is " \t\n\v\f\r", `\w`
#   is [A-Za-z0-9_] (std::regex's classes in the "C" locale). A non-ASCII character in the pattern is its
#   UTF-8 bytes, each matched on its own (std::regex over a std::string).
from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Union

from constraintd.errors import GrammarError

__all__ = ["MAX_PROGRAM", "Program", "Scan"]

MAX_PROGRAM: Final = 10_000  # instructions of one pattern's program (each byte runs at most that many)
_QUOTED: Final = 64  # characters of a refused pattern an error quotes


def _table(test: object) -> bytes:
    return bytes(1 if test(b) else 0 for b in range(256))  # type: ignore[operator]


def _is_word(b: int) -> bool:
    return 48 <= b <= 57 or 65 <= b <= 90 or 97 <= b <= 122 or b == 95


_DIGIT: Final = _table(lambda b: 48 <= b <= 57)
_SPACE: Final = _table(lambda b: b in b" \t\n\v\f\r")
_WORD: Final = _table(_is_word)
_DOT: Final = _table(lambda b: b not in b"\n\r")
_CLASS_ESCAPES: Final = {
    ord("d"): _DIGIT,
    ord("s"): _SPACE,
    ord("w"): _WORD,
    ord("D"): bytes(1 - v for v in _DIGIT),
    ord("S"): bytes(1 - v for v in _SPACE),
    ord("W"): bytes(1 - v for v in _WORD),
}
_CHAR_ESCAPES: Final = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("f"): 12, ord("v"): 11}
_QUANTIFIERS: Final = frozenset(b"*+?{")

# Syntax tree: ("set", table) ("cat", items) ("alt", items) ("group", n | -1, node)
# ("rep", node, min, max | -1, greedy) ("bol",) ("eol",) ("word", negate) ("look", negate, node)
Node = tuple[object, ...]

# Instructions: (CHAR, table) (SPLIT, preferred, other) (JMP, to) (SAVE, slot) (BOL,) (EOL,)
# (WORD, negate) (LOOK, negate, program) (MATCH,)
CHAR, SPLIT, JMP, SAVE, BOL, EOL, WORD, LOOK, MATCH = range(9)
Instruction = tuple[object, ...]
Captures = tuple[int, ...]
Thread = tuple[int, Captures]


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.src = pattern.encode("utf-8", "surrogatepass")
        self.pos = 0
        self.groups = 0
        self.in_look = False

    def error(self, what: str) -> GrammarError:
        shown = self.pattern if len(self.pattern) <= _QUOTED else self.pattern[:_QUOTED] + "..."
        return GrammarError(f"invalid trigger pattern {shown!r}: it {what}")

    def peek(self, offset: int = 0) -> int:
        at = self.pos + offset
        return self.src[at] if at < len(self.src) else -1

    def parse(self) -> Node:
        node = self.disjunction()
        if self.pos < len(self.src):
            raise self.error("has an unbalanced ')'")
        return node

    def disjunction(self) -> Node:
        items = [self.alternative()]
        while self.peek() == ord("|"):
            self.pos += 1
            items.append(self.alternative())
        return items[0] if len(items) == 1 else ("alt", tuple(items))

    def alternative(self) -> Node:
        items: list[Node] = []
        while self.peek() not in (-1, ord("|"), ord(")")):
            items.append(self.term())
        return items[0] if len(items) == 1 else ("cat", tuple(items))

    def term(self) -> Node:
        c = self.peek()
        assertion: Node | None = None
        if c == ord("^"):
            assertion = ("bol",)
        elif c == ord("$"):
            assertion = ("eol",)
        elif c == ord("\\") and self.peek(1) in (ord("b"), ord("B")):
            assertion = ("word", self.peek(1) == ord("B"))
            self.pos += 1
        if assertion is not None:
            self.pos += 1
            if self.peek() in _QUANTIFIERS:
                raise self.error("repeats an assertion")
            return assertion
        if self.src.startswith((b"(?=", b"(?!"), self.pos):
            return self.lookahead()
        atom = self.atom()
        c = self.peek()
        if c not in _QUANTIFIERS:
            return atom
        low, high = self.quantifier()
        greedy = True
        if self.peek() == ord("?"):
            self.pos += 1
            greedy = False
        if self.peek() in _QUANTIFIERS:
            raise self.error("repeats a repetition")
        return ("rep", atom, low, high, greedy)

    def lookahead(self) -> Node:
        if self.in_look:
            raise self.error("nests a lookahead in a lookahead (not supported)")
        negate = self.src[self.pos + 2] == ord("!")
        self.pos += 3
        self.in_look = True
        body = self.disjunction()
        self.in_look = False
        self.expect_close()
        if _longest(body) is None:
            raise self.error("has a lookahead of unbounded length (not supported)")
        if self.peek() in _QUANTIFIERS:
            raise self.error("repeats an assertion")
        return ("look", negate, body)

    def expect_close(self) -> None:
        if self.peek() != ord(")"):
            raise self.error("has an unterminated group")
        self.pos += 1

    def quantifier(self) -> tuple[int, int]:
        c = self.src[self.pos]
        self.pos += 1
        if c != ord("{"):
            return {ord("*"): (0, -1), ord("+"): (1, -1), ord("?"): (0, 1)}[c]
        low = self.number()
        high = low
        if self.peek() == ord(","):
            self.pos += 1
            high = self.number() if self.peek() != ord("}") else -1
        if low < 0 or self.peek() != ord("}") or (high == -1 and self.src[self.pos - 1] != ord(",")):
            raise self.error("has a malformed {} repetition (a literal '{' must be escaped)")
        self.pos += 1
        if high != -1 and high < low:
            raise self.error("has a repetition {n,m} with m < n")
        return low, high

    def number(self) -> int:
        start = self.pos
        while 48 <= self.peek() <= 57:
            self.pos += 1
        if self.pos == start:
            return -1
        if self.pos - start > 6:
            raise self.error("has a repetition count too large")
        return int(self.src[start : self.pos])

    def atom(self) -> Node:
        c = self.peek()
        self.pos += 1
        if c == ord("."):
            return ("set", _DOT)
        if c == ord("("):
            if self.peek() == ord("?"):
                if self.peek(1) != ord(":"):
                    raise self.error("uses a (?... construct that is not supported")
                self.pos += 2
                body = self.disjunction()
                self.expect_close()
                return body
            if self.in_look:
                raise self.error("captures inside a lookahead (not supported)")
            self.groups += 1
            group = self.groups
            body = self.disjunction()
            self.expect_close()
            return ("group", group, body)
        if c == ord("["):
            return self.char_class()
        if c == ord("\\"):
            escaped = self.escape()
            return ("set", escaped if isinstance(escaped, bytes) else _single(escaped))
        if c in _QUANTIFIERS:
            raise self.error("repeats nothing")
        return ("set", _single(c))

    def escape(self) -> int | bytes:
        # after the backslash: a byte, or the table of a class escape
        c = self.peek()
        if c == -1:
            raise self.error("ends with a lone backslash")
        self.pos += 1
        if c in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[c]
        if c in _CHAR_ESCAPES:
            return _CHAR_ESCAPES[c]
        if c == ord("0") and not 48 <= self.peek() <= 57:
            return 0
        if c == ord("x"):
            digits = self.src[self.pos : self.pos + 2]
            if len(digits) == 2 and all(d in b"0123456789abcdefABCDEF" for d in digits):
                self.pos += 2
                return int(digits, 16)
            raise self.error("has a malformed \\x escape")
        if 48 <= c <= 57:
            raise self.error("uses a back-reference (not supported)")
        if 65 <= c <= 90 or 97 <= c <= 122:
            raise self.error(f"uses the escape \\{chr(c)}, not supported")
        return c

    def char_class(self) -> Node:
        negate = self.peek() == ord("^")
        if negate:
            self.pos += 1
        if self.peek() == ord("]"):
            raise self.error("uses the class [] or [^], not supported")
        table = bytearray(256)
        while True:
            c = self.peek()
            if c == -1:
                raise self.error("has an unterminated class")
            if c == ord("]"):
                self.pos += 1
                break
            low = self.class_item()
            if self.peek() == ord("-") and self.peek(1) not in (ord("]"), -1):
                self.pos += 1
                high = self.class_item()
                if isinstance(low, bytes) or isinstance(high, bytes) or high < low:
                    raise self.error("has a bad class range")
                table[low : high + 1] = b"\x01" * (high + 1 - low)
            elif isinstance(low, bytes):
                table = bytearray(a | b for a, b in zip(table, low, strict=True))
            else:
                table[low] = 1
        if negate:
            table = bytearray(1 - v for v in table)
        return ("set", bytes(table))

    def class_item(self) -> int | bytes:
        c = self.src[self.pos]
        self.pos += 1
        if c != ord("\\"):
            return c
        if self.peek() == ord("b"):
            self.pos += 1
            return 8  # backspace, inside a class
        if self.peek() == ord("-"):
            self.pos += 1
            return ord("-")
        return self.escape()


def _single(byte: int) -> bytes:
    table = bytearray(256)
    table[byte] = 1
    return bytes(table)


def _longest(node: Node) -> int | None:
    """The longest text `node` matches, None when unbounded."""
    kind = node[0]
    if kind == "set":
        return 1
    if kind in ("cat", "alt"):
        lengths = [_longest(item) for item in node[1]]  # type: ignore[attr-defined]
        if any(length is None for length in lengths):
            return None
        known = [length for length in lengths if length is not None]
        return sum(known) if kind == "cat" else max(known, default=0)
    if kind == "group":
        return _longest(node[2])  # type: ignore[arg-type]
    if kind == "rep":
        inner = _longest(node[1])  # type: ignore[arg-type]
        high = node[3]
        assert isinstance(high, int)
        if inner == 0:
            return 0
        return None if inner is None or high == -1 else inner * high
    return 0  # assertions


class _Emitter:
    def __init__(self, parser: _Parser) -> None:
        self.parser = parser
        self.code: list[Instruction] = []

    def add(self, *instruction: object) -> int:
        if len(self.code) >= MAX_PROGRAM:
            raise self.parser.error(f"compiles to more than {MAX_PROGRAM} instructions")
        self.code.append(instruction)
        return len(self.code) - 1

    def emit(self, node: Node) -> None:
        kind = node[0]
        code = self.code
        if kind == "set":
            self.add(CHAR, node[1])
        elif kind == "cat":
            for item in node[1]:  # type: ignore[attr-defined]
                self.emit(item)
        elif kind == "alt":
            items: tuple[Node, ...] = node[1]  # type: ignore[assignment]
            jumps = []
            for index, item in enumerate(items):
                if index < len(items) - 1:
                    split = self.add(SPLIT, 0, 0)
                    self.emit(item)
                    jumps.append(self.add(JMP, 0))
                    code[split] = (SPLIT, split + 1, len(code))
                else:
                    self.emit(item)
            for jump in jumps:
                code[jump] = (JMP, len(code))
        elif kind == "group":
            group: int = node[1]  # type: ignore[assignment]
            self.add(SAVE, 2 * group)
            self.emit(node[2])  # type: ignore[arg-type]
            self.add(SAVE, 2 * group + 1)
        elif kind == "rep":
            self.repeat(node)
        elif kind == "bol":
            self.add(BOL)
        elif kind == "eol":
            self.add(EOL)
        elif kind == "word":
            self.add(WORD, node[1])
        else:  # look
            inner = _Emitter(self.parser)
            inner.emit(node[2])  # type: ignore[arg-type]
            inner.add(MATCH)
            if len(code) + len(inner.code) >= MAX_PROGRAM:
                raise self.parser.error(f"compiles to more than {MAX_PROGRAM} instructions")
            self.add(LOOK, node[1], tuple(inner.code))

    def repeat(self, node: Node) -> None:
        _, body, low, high, greedy = node
        assert isinstance(low, int) and isinstance(high, int)
        code = self.code
        for _ in range(low):
            self.emit(body)  # type: ignore[arg-type]
        if high == -1:
            loop = self.add(SPLIT, 0, 0)
            self.emit(body)  # type: ignore[arg-type]
            self.add(JMP, loop)
            code[loop] = (SPLIT, loop + 1, len(code)) if greedy else (SPLIT, len(code), loop + 1)
            return
        splits = []
        for _ in range(high - low):
            splits.append(self.add(SPLIT, 0, 0))
            self.emit(body)  # type: ignore[arg-type]
        for split in splits:
            code[split] = (SPLIT, split + 1, len(code)) if greedy else (SPLIT, len(code), split + 1)


@dataclass(frozen=True, slots=True)
class Scan:
    """Where a search stands after a prefix of the text: `pos` bytes consumed, the threads waiting at
    `pos` (before its assertions ran), in priority order. Immutable: a matcher keeps one per token."""

    pos: int
    threads: tuple[Thread, ...]


_Found = Union[Captures, None]  # noqa: UP007 - a runtime alias


@dataclass(frozen=True, slots=True)
class Program:
    """One pattern, compiled.

    Attributes:
        code: the instructions.
        groups: capturing groups.
        lag: the bytes after a position its assertions read (1 + the longest lookahead).
    """

    code: tuple[Instruction, ...]
    groups: int
    lag: int

    @classmethod
    def compile(cls, pattern: str) -> Program:
        """Compile an ECMAScript pattern.

        Raises:
            GrammarError: the pattern is malformed or uses a construct not supported (see above).
        """
        parser = _Parser(pattern)
        tree = parser.parse()
        emitter = _Emitter(parser)
        emitter.emit(tree)
        emitter.add(SAVE, 1)
        emitter.add(MATCH)
        lookahead = max((len(i[2]) for i in emitter.code if i[0] == LOOK), default=0)  # type: ignore[arg-type]
        return cls(tuple(emitter.code), parser.groups, 1 + lookahead)

    def start(self, *, anchored: bool) -> Scan:
        """The scan of the empty prefix: anchored (regex_match) starts one thread at 0; a search starts one
        at every position until it has a match."""
        if not anchored:
            return Scan(0, (_NEW,))
        return Scan(0, ((0, (0,) + (-1,) * (2 * self.groups + 1)),))

    def advance(self, scan: Scan, data: bytes | bytearray, *, anchored: bool) -> tuple[Scan, _Found]:
        """Take `scan` over `data[scan.pos:]` (the text so far is `data`) and look for a match in `data`.

        Returns:
            The scan to keep (it has consumed all but the last `lag` bytes at most) and the captures of
            the match std::regex finds in `data` now (regex_match when anchored, else regex_search), or
            None. Costs O((len(data) - scan.pos + lag) x len(code)).
        """
        end = len(data)
        mode = _WHOLE if anchored else _SEARCH
        pos, threads = scan.pos, scan.threads
        found: _Found = None
        while pos + self.lag <= end:
            runnable, match = self._closure(threads, pos, data, end, False, mode)
            if match is not None:
                found = match  # the threads above it run on: they may still match, later
            threads = self._step(runnable, data[pos], found is None and not anchored)
            pos += 1
        kept = Scan(pos, threads)
        # the rest, knowing the text ends at `end` (not kept: more text changes what it answers)
        while True:
            runnable, match = self._closure(threads, pos, data, end, True, mode)
            if match is not None:
                found = match
            if pos == end:
                return kept, found
            threads = self._step(runnable, data[pos], found is None and not anchored)
            pos += 1

    def _step(self, runnable: list[Thread], byte: int, searching: bool) -> tuple[Thread, ...]:
        code = self.code
        moved = tuple((pc + 1, caps) for pc, caps in runnable if code[pc][1][byte])  # type: ignore[index]
        return (*moved, _NEW) if searching else moved

    def _closure(
        self, threads: tuple[Thread, ...], pos: int, data: bytes | bytearray, end: int, final: bool, mode: int
    ) -> tuple[list[Thread], _Found]:
        # The threads at `pos` after every assertion and jump, in priority order, stopped at CHARs; and
        # the captures of the highest-priority thread that reaches MATCH (a search drops every thread
        # below it; regex_match counts a MATCH only at the end of the text).
        code = self.code
        seen: set[int] = set()
        runnable: list[Thread] = []
        for first in threads:
            if first is _NEW:
                first = (0, (pos,) + (-1,) * (2 * self.groups + 1))
            stack: list[Thread] = [first]
            while stack:
                pc, caps = stack.pop()
                if pc in seen:
                    continue
                seen.add(pc)
                instruction = code[pc]
                op = instruction[0]
                if op == CHAR:
                    runnable.append((pc, caps))
                elif op == SPLIT:
                    stack.append((instruction[2], caps))  # type: ignore[arg-type]
                    stack.append((instruction[1], caps))  # type: ignore[arg-type]
                elif op == JMP:
                    stack.append((instruction[1], caps))  # type: ignore[arg-type]
                elif op == SAVE:
                    slot: int = instruction[1]  # type: ignore[assignment]
                    stack.append((pc + 1, (*caps[:slot], pos, *caps[slot + 1 :])))
                elif op == MATCH:
                    if mode != _WHOLE or (final and pos == end):
                        return runnable, caps
                elif _holds(instruction, pos, data, end, final):
                    stack.append((pc + 1, caps))
        return runnable, None


_NEW: Final[Thread] = (-1, ())  # a search's thread starting at this position (the lowest priority)
_SEARCH, _WHOLE, _PREFIX = range(3)  # regex_search, regex_match, a lookahead's body (a match anywhere)


def _holds(instruction: Instruction, pos: int, data: bytes | bytearray, end: int, final: bool) -> bool:
    op = instruction[0]
    if op == BOL:
        return pos == 0
    if op == EOL:
        return final and pos == end
    if op == WORD:
        before = pos > 0 and _is_word(data[pos - 1])
        after = pos < end and _is_word(data[pos])
        return (before != after) != instruction[1]
    # LOOK: its body matches from `pos` (within `lag` bytes, which a scan has unless it is `final`)
    body = Program(instruction[2], 0, 1)  # type: ignore[arg-type]
    threads: tuple[Thread, ...] = ((0, ()),)
    matched = False
    at = pos
    while threads:
        runnable, match = body._closure(threads, at, data, end, final, _PREFIX)
        if match is not None or at >= end:
            matched = match is not None
            break
        threads = body._step(runnable, data[at], False)
        at += 1
    return matched != instruction[1]
