# A JSON-schema `pattern` as an exact GBNF rule, for the extended dialect (schema/extended.py).
#
# Contract: `pattern_rule(pattern)` returns a GBNF expression for a JSON string (quotes included) whose
# value the pattern matches, as ECMA-262 reads it (the regex dialect JSON Schema names), or raises
# `Unsupported`. Unlike llama.cpp's translation (schema/patterns.py), it matches the string's value, not its
# JSON text:
# - a pattern is unanchored unless it says otherwise: an alternative without `^` may start anywhere, one
#   without `$` may end anywhere (any text around it);
# - each character the pattern matches is taken in its JSON spelling: raw, or for a quote, a backslash, a
#   control character or DEL, their escapes (`\"`, `\\`, `\n`, `\u001f`, ...). A character that needs no
#   escape is taken raw only (`\u0061` for `a` is refused): a valid spelling refused, never an invalid one
#   taken. Text around an unanchored pattern is any JSON string text, every spelling;
# - `.` is any character but the line terminators (\n, \r, U+2028, U+2029); `\d` is [0-9], `\w` is
#   [A-Za-z0-9_], `\s` is ECMA's white space and line terminators (Unicode spaces included), and their
#   negations are the rest of Unicode. Character classes, ranges, groups (capturing, `(?:`), alternatives,
#   `* + ? {n} {n,} {n,m}` (lazy or not: the same language), escapes of syntax characters, `\t \n \v \f \r
#   \0 \xHH \uHHHH \u{H...} \cX` are read. An unbounded repetition of what may be empty (`(a*)*`) is
#   written as the repetition of its non-empty strings, the same language (GBNF refuses the other form).
# - Refused (`Unsupported`, and the dialect keeps llama.cpp's translation and its report): lookarounds,
#   backreferences, word boundaries, named groups, `\p{...}`, anchors anywhere but at an alternative's ends,
#   a `{` that is no quantifier, counts over MAX_COUNT, lone surrogates, and a pattern that is not one.
# - With `min_length` / `max_length`, the lengths too where `_within_lengths` can write them (else refused).
# - `complement_rule(pattern)`: the JSON strings a pattern of the form `^C*$` / `^C+$` does not match.
# Invariants: characters are code points (the `u` flag's reading); the parse recurses once per group and
# stops at MAX_DEPTH.
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

__all__ = [
    "ANY_JSON_CHAR", "MAX_COUNT", "MAX_DEPTH", "AddRule", "Unsupported", "complement_rule", "pattern_rule",
]

MAX_COUNT: Final = 1000
MAX_DEPTH: Final = 64
_MAX_CHAR: Final = 0x10FFFF
_Ranges: TypeAlias = tuple[tuple[int, int], ...]


class Unsupported(Exception):
    """The pattern has no exact translation here."""


def _normal(ranges: list[tuple[int, int]]) -> _Ranges:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)


def _complement(ranges: _Ranges) -> _Ranges:
    out, start = [], 0
    for low, high in ranges:
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= _MAX_CHAR:
        out.append((start, _MAX_CHAR))
    return tuple(out)


def _chars(text: str) -> _Ranges:
    return _normal([(ord(c), ord(c)) for c in text])


_DIGIT: Final = ((0x30, 0x39),)
_WORD: Final = _normal([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
_LINE_TERMINATORS: Final = _chars("\n\r\u2028\u2029")
_SPACE: Final = _normal([*_chars("\t\v\f \u00a0\u1680\u202f\u205f\u3000\ufeff"), (0x2000, 0x200A),
                         *_LINE_TERMINATORS])
_DOT: Final = _complement(_LINE_TERMINATORS)
_CLASS_ESCAPES: Final[dict[str, _Ranges]] = {
    "d": _DIGIT, "D": _complement(_DIGIT), "w": _WORD, "W": _complement(_WORD), "s": _SPACE,
    "S": _complement(_SPACE),
}
_CONTROL_ESCAPES: Final = {"t": 9, "n": 10, "v": 11, "f": 12, "r": 13}
_SYNTAX: Final = frozenset("^$\\.*+?()[]{}|/-")


@dataclass(frozen=True, slots=True)
class _Chars:
    ranges: _Ranges


@dataclass(frozen=True, slots=True)
class _Seq:
    items: tuple[_Node, ...]


@dataclass(frozen=True, slots=True)
class _Alt:
    branches: tuple[_Node, ...]


@dataclass(frozen=True, slots=True)
class _Repeat:
    item: _Node
    low: int
    high: int | None


@dataclass(frozen=True, slots=True)
class _Anchor:
    start: bool  # ^ (else $)


_Node: TypeAlias = _Chars | _Seq | _Alt | _Repeat | _Anchor


def _single(ranges: _Ranges) -> bool:
    return len(ranges) == 1 and ranges[0][0] == ranges[0][1]


def _nullable(node: _Node) -> bool:
    if isinstance(node, _Chars):
        return False
    if isinstance(node, _Seq):
        return all(map(_nullable, node.items))
    if isinstance(node, _Alt):
        return any(map(_nullable, node.branches))
    if isinstance(node, _Repeat):
        return node.low == 0 or _nullable(node.item)
    return True


def _has_anchor(node: _Node) -> bool:
    if isinstance(node, _Anchor):
        return True
    if isinstance(node, _Seq | _Alt):
        return any(map(_has_anchor, node.items if isinstance(node, _Seq) else node.branches))
    return isinstance(node, _Repeat) and _has_anchor(node.item)


def _non_empty(node: _Node) -> _Node | None:
    """A node of the non-empty strings `node` matches (None: it matches the empty string only); no anchor
    inside."""
    if not _nullable(node):
        return node
    if isinstance(node, _Seq):
        # every item may be empty: the first non-empty one, then any of the rest
        terms = []
        for i, item in enumerate(node.items):
            first = _non_empty(item)
            if first is not None:
                terms.append(_Seq((first, *node.items[i + 1 :])))
        return None if not terms else terms[0] if len(terms) == 1 else _Alt(tuple(terms))
    if isinstance(node, _Alt):
        branches = [branch for branch in map(_non_empty, node.branches) if branch is not None]
        return None if not branches else branches[0] if len(branches) == 1 else _Alt(tuple(branches))
    assert isinstance(node, _Repeat)
    if node.high == 0:
        return None
    # x{l,h}, x or l = 0 nullable: the non-empty strings are at least one non-empty x, up to h of them
    repeated = _non_empty(node.item)
    return None if repeated is None else _Repeat(repeated, 1, node.high)


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.i = 0
        self.depth = 0

    def peek(self) -> str:
        return self.text[self.i] if self.i < len(self.text) else ""

    def take(self) -> str:
        char = self.peek()
        if not char:
            raise Unsupported("the pattern ends early")
        self.i += 1
        return char

    def alternatives(self) -> _Node:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else _Alt(tuple(branches))

    def sequence(self) -> _Seq:
        items: list[_Node] = []
        while self.peek() not in ("", "|", ")"):
            atom = self.atom()
            items.append(self.quantified(atom))
        return _Seq(tuple(items))

    def atom(self) -> _Node:
        char = self.take()
        if char == "(":
            if self.peek() == "?":
                if self.text[self.i : self.i + 2] != "?:":
                    raise Unsupported("lookarounds and named groups are not read")
                self.i += 2
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise Unsupported("groups nest too deep")
            inner = self.alternatives()
            if self.take() != ")":
                raise Unsupported("unbalanced parentheses")
            self.depth -= 1
            return inner
        if char in "^$":
            return _Anchor(char == "^")
        if char == ".":
            return _Chars(_DOT)
        if char == "[":
            return self.char_class()
        if char == "\\":
            return _Chars(self.escape(in_class=False))
        if char in "*+?{)":
            raise Unsupported(f"{char} with nothing to repeat")
        return _Chars(_chars(char))

    def count(self) -> int:
        start = self.i
        while self.peek().isdigit() and self.peek().isascii():
            self.i += 1
        if self.i == start:
            raise Unsupported("a { that is no quantifier")
        value = int(self.text[start : self.i])
        if value > MAX_COUNT:
            raise Unsupported(f"a count over {MAX_COUNT}")
        return value

    def quantified(self, atom: _Node) -> _Node:
        char = self.peek()
        if char not in ("*", "+", "?", "{"):
            return atom
        self.i += 1
        if char == "{":
            low = self.count()
            high: int | None = low
            if self.peek() == ",":
                self.i += 1
                high = None if self.peek() == "}" else self.count()
            if self.take() != "}" or (high is not None and high < low):
                raise Unsupported("a { that is no quantifier")
        else:
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
        if self.peek() == "?":  # lazy: the same language
            self.i += 1
        if isinstance(atom, _Anchor):
            raise Unsupported("a repeated anchor")
        if self.peek() in ("*", "+", "?", "{"):
            raise Unsupported("a quantifier repeated")
        if high is None and _nullable(atom):
            # GBNF's repetition of what may be empty recurses on the left, which grammars refuse: the same
            # language is the repetition, from 0, of the atom's non-empty strings
            if _has_anchor(atom):
                raise Unsupported("an unbounded repetition of what may be empty")
            inner = _non_empty(atom)
            while isinstance(inner, _Seq) and len(inner.items) == 1:
                inner = inner.items[0]
            if isinstance(inner, _Repeat) and inner.high is None and inner.low <= 1:
                inner = inner.item  # (x+)* is x*, and is not ambiguous
            return _Seq(()) if inner is None else _Repeat(inner, 0, None)
        return _Repeat(atom, low, high)

    def hex_digits(self, count: int) -> int:
        digits = self.text[self.i : self.i + count]
        if len(digits) != count or not all(c in "0123456789abcdefABCDEF" for c in digits):
            raise Unsupported("a malformed hexadecimal escape")
        self.i += count
        return int(digits, 16)

    def escape(self, *, in_class: bool) -> _Ranges:
        char = self.take()
        if char in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[char]
        return _chars(chr(self.escaped_char(char, in_class=in_class)))

    def escaped_char(self, char: str, *, in_class: bool) -> int:
        if char in _CONTROL_ESCAPES:
            return _CONTROL_ESCAPES[char]
        if char == "b" and in_class:
            return 8
        if char == "0" and not self.peek().isdigit():
            return 0
        if char == "x":
            return self.hex_digits(2)
        if char == "u":
            if self.peek() == "{":
                self.i += 1
                end = self.text.find("}", self.i)
                digits = self.text[self.i : end] if end > self.i else ""
                if not digits or len(digits) > 6 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                    raise Unsupported("a malformed code point escape")
                self.i = end + 1
                value = int(digits, 16)
            else:
                value = self.hex_digits(4)
            if 0xD800 <= value <= 0xDFFF or value > _MAX_CHAR:
                raise Unsupported("a surrogate or out-of-range code point")
            return value
        if char == "c" and self.peek().isascii() and self.peek().isalpha():
            return ord(self.take()) % 32
        if char in _SYNTAX:
            return ord(char)
        if char.isascii() and char.isalnum():
            raise Unsupported(f"the escape \\{char} is not read")
        return ord(char)  # an identity escape of punctuation

    def class_atom(self) -> _Ranges:
        char = self.take()
        if char == "\\":
            return self.escape(in_class=True)
        return _chars(char)

    def char_class(self) -> _Chars:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        if self.peek() == "]":
            raise Unsupported("an empty character class")
        ranges: list[tuple[int, int]] = []
        while self.peek() != "]":
            first = self.class_atom()
            if self.peek() == "-" and self.text[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                last = self.class_atom()
                if not (_single(first) and _single(last)):
                    raise Unsupported("a range between classes")
                if first[0][0] > last[0][0]:
                    raise Unsupported("a range out of order")
                ranges.append((first[0][0], last[0][0]))
            else:
                ranges.extend(first)
        self.i += 1
        normal = _normal(ranges)
        return _Chars(_complement(normal) if negated else normal)


# -- the grammar ------------------------------------------------------------------------------------------

_SHORT_ESCAPES: Final = {0x22: '"', 0x5C: "\\\\", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}
_NEEDS_ESCAPE: Final = _normal([(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)])
ANY_JSON_CHAR: Final = '[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})'


def _class_char(code: int) -> str:
    char = chr(code)
    if char.isascii() and char.isalnum():
        return char
    return f"\\x{code:02X}" if code < 0x80 else f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"


def _intersect(ranges: _Ranges, other: _Ranges) -> _Ranges:
    out = []
    for low, high in ranges:
        for other_low, other_high in other:
            if max(low, other_low) <= min(high, other_high):
                out.append((max(low, other_low), min(high, other_high)))
    return _normal(out)


def _hex_class(digits: set[str]) -> str:
    letters = "".join(sorted(digits))
    both = "".join(sorted({*letters, *letters.upper(), *letters.lower()}))
    return f"[{both}]"


def _spelled(ranges: _Ranges) -> str:
    """The JSON spellings of the characters of `ranges`: raw where JSON allows, else escaped."""
    parts = []
    raw = _intersect(ranges, _complement(_NEEDS_ESCAPE))
    if raw:
        spans = (_class_char(low) if low == high else f"{_class_char(low)}-{_class_char(high)}"
                 for low, high in raw)
        parts.append("[" + "".join(spans) + "]")
    special = [code for low, high in _intersect(ranges, _NEEDS_ESCAPE) for code in range(low, high + 1)]
    if special:
        escapes = []
        short = "".join(_SHORT_ESCAPES[code] for code in special if code in _SHORT_ESCAPES)
        if short:
            escapes.append(f"[{short}]")
        by_first: dict[str, set[str]] = {}
        for code in special:
            text = f"{code:02x}"
            by_first.setdefault(text[0], set()).add(text[1])
        hexes = [f'"{first}" {_hex_class(seconds)}' for first, seconds in sorted(by_first.items())]
        escapes.append('"u00" (' + " | ".join(hexes) + ")")
        parts.append("[\\\\] (" + " | ".join(escapes) + ")")
    if not parts:
        raise Unsupported("a class that matches nothing")
    return parts[0] if len(parts) == 1 else "(" + " | ".join(parts) + ")"


AddRule: TypeAlias = Callable[[str, str], str]


def _emit(node: _Node, add_rule: AddRule | None, name: str) -> str:
    if isinstance(node, _Chars):
        return _spelled(node.ranges)
    if isinstance(node, _Seq):
        if not node.items:
            return '""'
        return " ".join(_emit(item, add_rule, name) for item in node.items)
    if isinstance(node, _Alt):
        return "(" + " | ".join(_emit(branch, add_rule, name) for branch in node.branches) + ")"
    if isinstance(node, _Repeat):
        inner = f"({_emit(node.item, add_rule, name)})"
        counted = (node.low, node.high) not in ((0, None), (1, None), (0, 1))
        if counted and add_rule is not None and "(" in inner[1:-1]:
            # GBNF copies a counted group's inner groups once per count (and bounds their product): a
            # rule of its own is copied as one name
            inner = add_rule(f"{name}-item", inner[1:-1])
        if (node.low, node.high) == (0, None):
            return inner + "*"
        if (node.low, node.high) == (1, None):
            return inner + "+"
        if (node.low, node.high) == (0, 1):
            return inner + "?"
        if node.high is None:
            return f"{inner}{{{node.low},}}"
        return f"{inner}{{{node.low}}}" if node.low == node.high else f"{inner}{{{node.low},{node.high}}}"
    raise Unsupported("an anchor inside the pattern")


def _branches(root: _Node) -> tuple[_Seq, ...]:
    if isinstance(root, _Alt):
        return tuple(branch if isinstance(branch, _Seq) else _Seq((branch,)) for branch in root.branches)
    return (root if isinstance(root, _Seq) else _Seq((root,)),)


def _lengths(node: _Node) -> tuple[int, int | None]:
    """The fewest and most characters a node matches (None: no most)."""
    if isinstance(node, _Chars):
        return 1, 1
    if isinstance(node, _Anchor):
        return 0, 0
    if isinstance(node, _Seq | _Alt):
        parts = [_lengths(item) for item in (node.items if isinstance(node, _Seq) else node.branches)]
        lows = [low for low, _ in parts]
        highs = [high for _, high in parts]
        bounded = [high for high in highs if high is not None]
        if isinstance(node, _Seq):
            return sum(lows), None if len(bounded) < len(highs) else sum(bounded)
        return min(lows), None if len(bounded) < len(highs) else max(bounded)
    low, high = _lengths(node.item)
    if node.high is None:
        return low * node.low, None if high != 0 else 0
    return low * node.low, None if high is None else high * node.high


def _flat(items: tuple[_Node, ...]) -> list[_Node]:
    out: list[_Node] = []
    for item in items:
        out.extend(_flat(item.items) if isinstance(item, _Seq) else [item])
    return out


def _whole(branch: _Seq, max_length: int) -> _Seq:
    """A branch anchored at both ends where a value of at most max_length characters can hold a match of it
    only as the whole value: every match is at least max_length long. Unchanged otherwise."""
    items = _flat(branch.items)
    start = bool(items) and items[0] == _Anchor(True)
    end = bool(items) and items[-1] == _Anchor(False)
    core = items[int(start):len(items) - int(end)]
    if (start and end) or _lengths(_Seq(tuple(core)))[0] < max_length:
        return branch
    return _Seq((_Anchor(True), *core, _Anchor(False)))


def _within_lengths(root: _Node, min_length: int, max_length: int | None) -> _Node:
    """The pattern's tree, restricted to values of min_length..max_length characters: unchanged when every
    value it matches has such a length, else with the one repetition of single characters among fixed-length
    parts counted to fit; Unsupported otherwise. An unanchored branch whose every match is at least
    max_length long is read anchored (a value no longer than its match is the match)."""
    if max_length is not None:
        branches = tuple(_whole(branch, max_length) for branch in _branches(root))
        root = branches[0] if len(branches) == 1 else _Alt(branches)
    def fits(branch: _Seq) -> bool:
        items = _flat(branch.items)
        anchored = bool(items) and items[0] == _Anchor(True) and items[-1] == _Anchor(False)
        low, high = _lengths(branch)
        if not anchored:  # any text around it
            high = None
        return low >= min_length and (max_length is None or (high is not None and high <= max_length))

    if all(map(fits, _branches(root))):
        return root
    items = _flat(root.items) if isinstance(root, _Seq) else None
    if items is None or not items or items[0] != _Anchor(True) or items[-1] != _Anchor(False):
        raise Unsupported("a length beside this pattern")
    variable = [i for i, item in enumerate(items) if _lengths(item)[0] != _lengths(item)[1]]
    if len(variable) != 1:
        raise Unsupported("a length beside this pattern")
    repeat = items[variable[0]]
    if not (isinstance(repeat, _Repeat) and isinstance(repeat.item, _Chars)):
        raise Unsupported("a length beside this pattern")
    fixed = sum(_lengths(item)[0] for item in items) - repeat.low
    count_low = max(repeat.low, min_length - fixed)
    count_high = max_length - fixed if max_length is not None else None
    if repeat.high is not None:
        count_high = repeat.high if count_high is None else min(count_high, repeat.high)
    if count_high is not None and count_low > count_high:
        raise Unsupported("the lengths admit no value of the pattern")
    if max(count_low, count_high or 0) > MAX_COUNT:
        raise Unsupported(f"a count over {MAX_COUNT}")
    items[variable[0]] = _Repeat(repeat.item, count_low, count_high)
    return _Seq(tuple(items))


def pattern_rule(pattern: str, any_char_rule: str, add_rule: AddRule | None = None, name: str = "pattern", *,
                 min_length: int = 0, max_length: int | None = None) -> str:
    """A GBNF expression for the JSON strings (quotes included) whose value `pattern` matches (ECMA-262);
    `any_char_rule` names a rule taking any JSON string character in any spelling (the text around an
    unanchored pattern). With `add_rule` (name, text -> the name given), a counted repetition of groups
    is written as a rule of its own, named after `name`. With lengths, only values of min_length to
    max_length characters: where every value the pattern matches has such a length, or the pattern is
    anchored and its one variable part is a repeated character class among fixed-length parts.

    Raises:
        Unsupported: the pattern uses what this translation does not read (see the module comment).
    """
    parser = _Parser(pattern)
    root = parser.alternatives()
    if parser.i != len(pattern):
        raise Unsupported("unbalanced parentheses")
    if min_length > 0 or max_length is not None:
        root = _within_lengths(root, min_length, max_length)
    alternatives = []
    for branch in _branches(root):
        items = list(branch.items)
        anchored_start = bool(items) and items[0] == _Anchor(True)
        if anchored_start:
            items.pop(0)
        anchored_end = bool(items) and items[-1] == _Anchor(False)
        if anchored_end:
            items.pop()
        body = _emit(_Seq(tuple(items)), add_rule, name)
        around = [] if anchored_start else [f"{any_char_rule}*"]
        around_end = [] if anchored_end else [f"{any_char_rule}*"]
        alternatives.append(" ".join([*around, body, *around_end]))
    return '"\\"" (' + " | ".join(alternatives) + ') "\\""'


def complement_rule(pattern: str, any_char_rule: str) -> str | None:
    """A GBNF expression for the JSON strings (quotes included) whose value `pattern` does not match, for
    the one form it is written for: `^C*$` or `^C+$` (C a character class, `.` or an escape), whose
    complement is the strings holding a character outside C (and, for `+`, the empty string); None for
    every other pattern. A character outside C is taken in its JSON spelling (`_spelled`), the text around
    it in any spelling: a string of C's characters only is never taken, however spelled."""
    try:
        parser = _Parser(pattern)
        root = parser.alternatives()
    except Unsupported:
        return None
    if parser.i != len(pattern):
        return None
    items = _flat(root.items) if isinstance(root, _Seq) else [root]
    if len(items) != 3 or items[0] != _Anchor(True) or items[2] != _Anchor(False):
        return None
    repeat = items[1]
    if not (isinstance(repeat, _Repeat) and isinstance(repeat.item, _Chars) and repeat.low in (0, 1)
            and repeat.high is None):
        return None
    outside = _complement(repeat.item.ranges)
    alternatives = [f"{any_char_rule}* {_spelled(outside)} {any_char_rule}*"] if outside else []
    if repeat.low == 1:
        alternatives.append("")
    if not alternatives:
        return None
    return '"\\"" (' + " | ".join(alternatives) + ') "\\""'
