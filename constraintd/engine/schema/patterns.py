# A JSON-schema `pattern` as GBNF: llama.cpp's `_pattern_to_rule` (common/json-schema-to-grammar.cpp).
#
# Contract: `pattern_to_rule(pattern, name, add_rule)` makes the same `add_rule` calls in the same order,
# and returns the same rule text, as llama.cpp; it raises `UnsupportedPattern` (a valid regex with no
# grammar equivalent: llama.cpp then accepts any string and warns) or `InvalidPattern` (llama.cpp then
# fails the conversion) with llama.cpp's messages, at the same point of the walk.
#
# Invariants:
# - Text is bytes. llama.cpp walks the pattern one `char` at a time, so a multi-byte UTF-8 character is
#   several "characters" here too: the pattern, and every text given to or returned from this module, is a
#   byte string held in a `str` with one character per byte (latin-1). The caller converts.
# - Recursion is one level per group and stops at llama.cpp's `MAX_PATTERN_DEPTH` (unsupported beyond).
from __future__ import annotations

from collections.abc import Callable
from typing import Final

from constraintd.engine.schema.ranges import INT_MAX, build_repetition

__all__ = [
    "MAX_PATTERN_DEPTH",
    "InvalidPattern",
    "UnsupportedPattern",
    "gbnf_escape_length",
    "pattern_to_rule",
]

MAX_PATTERN_DEPTH: Final = 100
NON_LITERAL_SET: Final = frozenset("|.()[]{}*+?^$")
ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS: Final = frozenset("^$.[]()|{}*+?")
# keep in sync with parse_char() of the GBNF parser: escapes GBNF reads as one character
_SIMPLE_ESCAPES: Final = frozenset('trn\\"[]-')
_HEX_ESCAPES: Final = {"x": 2, "u": 4, "U": 8}
_HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")
_DIGITS: Final = frozenset("0123456789")
_C_SPACE: Final = " \t\n\v\f\r"

AddRule = Callable[[str, str], str]
_Piece = tuple[str, bool]  # (text, is_literal)


class UnsupportedPattern(Exception):
    """A valid regex with no grammar equivalent (llama.cpp's `unsupported_pattern`)."""


class InvalidPattern(Exception):
    """Not a valid regex (llama.cpp's `invalid_pattern`)."""


def gbnf_escape_length(pattern: str, pos: int) -> int:
    """Length of the escape at `pos` that GBNF reads as one character (`\\n`, `\\x41`, ...), 0 if none."""
    if pos + 1 >= len(pattern) or pattern[pos] != "\\":
        return 0
    kind = pattern[pos + 1]
    if kind in _SIMPLE_ESCAPES:
        return 2
    n_hex = _HEX_ESCAPES.get(kind, 0)
    if n_hex == 0 or pos + 2 + n_hex > len(pattern):
        return 0
    if not all(h in _HEX_DIGITS for h in pattern[pos + 2 : pos + 2 + n_hex]):
        return 0
    return 2 + n_hex


def _c_stoi(text: str) -> int:
    """std::stoi: leading C whitespace, a sign, decimal digits; ValueError where it throws."""
    rest = text.lstrip(_C_SPACE)
    sign = -1 if rest.startswith("-") else 1
    if rest[:1] in ("+", "-"):
        rest = rest[1:]
    digits = 0
    while digits < len(rest) and rest[digits] in _DIGITS:
        digits += 1
    if digits == 0:
        raise ValueError("no digits")
    value = sign * int(rest[:digits])
    if not -(2**31) <= value <= INT_MAX:
        raise ValueError("out of range")
    return value


def _to_rule(piece: _Piece) -> str:
    text, is_literal = piece
    return f'"{text}"' if is_literal else text


class _Translator:
    """The state of one `_pattern_to_rule` call (its lambdas' captures)."""

    def __init__(self, sub_pattern: str, name: str, add_rule: AddRule, dotall: bool) -> None:
        self.sub = sub_pattern
        self.name = name
        self.add_rule = add_rule
        self.dotall = dotall
        self.i = 0
        self.paren_depth = 0
        self.sub_rule_ids: dict[str, str] = {}

    def dot(self) -> str:
        return self.add_rule("dot", "[\\U00000000-\\U0010FFFF]" if self.dotall else "[^\\x0A\\x0D]")

    @staticmethod
    def join_seq(seq: list[_Piece]) -> _Piece:
        # consecutive literals merge into one
        merged: list[_Piece] = []
        literal = ""
        for text, is_literal in seq:
            if is_literal:
                literal += text
            else:
                if literal:
                    merged.append((literal, True))
                    literal = ""
                merged.append((text, False))
        if literal:
            merged.append((literal, True))
        return " ".join(_to_rule(piece) for piece in merged), False

    def transform(self) -> _Piece:
        seq: list[_Piece] = []
        sub, length = self.sub, len(self.sub)
        while self.i < length:
            c = sub[self.i]
            if c == ".":
                seq.append((self.dot(), False))
                self.i += 1
            elif c == "(":
                self.i += 1
                if self.i < length and sub[self.i] == "?":
                    if self.i + 1 < length and sub[self.i + 1] == ":":
                        self.i += 2  # a non-capturing group is a plain group
                    else:
                        raise UnsupportedPattern("unsupported group syntax")  # lookaround, named group, flags
                self.paren_depth += 1
                if self.paren_depth > MAX_PATTERN_DEPTH:
                    raise UnsupportedPattern("pattern nesting too deep")
                seq.append(("(" + _to_rule(self.transform()) + ")", False))
            elif c == ")":
                self.i += 1
                if self.paren_depth == 0:
                    raise InvalidPattern("unbalanced parentheses")
                self.paren_depth -= 1
                return self.join_seq(seq)
            elif c in "^$":
                raise UnsupportedPattern("anchor inside the pattern")
            elif c == "[":
                seq.append((self.char_class(), False))
            elif c == "|":
                seq.append(("|", False))
                self.i += 1
            elif c in "*+?":
                if not seq:
                    raise InvalidPattern("nothing to repeat")
                seq[-1] = (_to_rule(seq[-1]) + c, False)
                self.i += 1
            elif c == "{":
                self.curly(seq)
            else:
                seq.append((self.literal(c), True))
        return self.join_seq(seq)

    def char_class(self) -> str:
        sub, length = self.sub, len(self.sub)
        out = "["
        self.i += 1
        while self.i < length and sub[self.i] != "]":
            if sub[self.i] == "\\":
                escape_length = gbnf_escape_length(sub, self.i)
                if escape_length == 0:
                    escape = sub[self.i : self.i + 2]
                    raise UnsupportedPattern(f"unsupported escape in character class: {escape}")
                out += sub[self.i : self.i + escape_length]
                self.i += escape_length
            else:
                out += sub[self.i]
                self.i += 1
        if self.i >= length:
            raise InvalidPattern("unterminated character class")
        self.i += 1
        return out + "]"

    def curly(self, seq: list[_Piece]) -> None:
        sub, length = self.sub, len(self.sub)
        start = self.i + 1
        end = sub.find("}", start)
        if end < 0:
            self.i = length
            raise UnsupportedPattern("unterminated curly brackets")
        self.i = end + 1
        nums = sub[start:end].split(",")
        min_times, max_times = 0, INT_MAX
        if len(nums) not in (1, 2):
            raise UnsupportedPattern("wrong number of values in curly brackets")
        try:
            if len(nums) == 1:
                min_times = max_times = _c_stoi(nums[0])
            else:
                if nums[0]:
                    min_times = _c_stoi(nums[0])
                if nums[1]:
                    max_times = _c_stoi(nums[1])
        except ValueError:
            raise UnsupportedPattern("invalid number in curly brackets") from None
        if not seq:
            raise InvalidPattern("nothing to repeat")
        text, is_literal = seq[-1]
        if not is_literal:
            sub_id = self.sub_rule_ids.get(text)
            if not sub_id:
                self.sub_rule_ids[text] = ""  # counted before it is named: names start at -1
                sub_id = self.add_rule(f"{self.name}-{len(self.sub_rule_ids)}", text)
                self.sub_rule_ids[text] = sub_id
            text = sub_id
        seq[-1] = (build_repetition(f'"{text}"' if is_literal else text, min_times, max_times, ""), False)

    def literal(self, c: str) -> str:
        sub, length = self.sub, len(self.sub)
        literal = ""
        while self.i < length:
            here = sub[self.i]
            if here == "\\":
                if self.i == length - 1:
                    raise InvalidPattern("trailing backslash")
                following = sub[self.i + 1]
                if following in ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS:
                    literal += following
                    self.i += 2
                else:
                    escape_length = gbnf_escape_length(sub, self.i)
                    if escape_length == 0:
                        raise UnsupportedPattern(f"unsupported escape: {sub[self.i : self.i + 2]}")
                    literal += sub[self.i : self.i + escape_length]
                    self.i += escape_length
            elif here == '"':
                literal += '\\"'
                self.i += 1
            elif here not in NON_LITERAL_SET and (
                self.i == length - 1 or not literal or sub[self.i + 1] == "."
                or sub[self.i + 1] not in NON_LITERAL_SET
            ):
                literal += here
                self.i += 1
            else:
                break
        if not literal:  # nothing was consumed, e.g. a stray ']' or '}'
            raise UnsupportedPattern(f"unsupported character: {c}")
        return literal


def pattern_to_rule(pattern: str, name: str, add_rule: AddRule, *, dotall: bool = False) -> str:
    """Translate an anchored pattern (`^...$`, bytes as latin-1) into rule `name`; return the rule's name.

    Raises:
        UnsupportedPattern: llama.cpp has no translation; it warns and accepts any string instead.
        InvalidPattern: the pattern is not a regex; llama.cpp fails the conversion.
    """
    if len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
        raise UnsupportedPattern("not anchored with '^' and '$'")
    translator = _Translator(pattern[1:-1], name, add_rule, dotall)
    rule = _to_rule(translator.transform())
    if translator.paren_depth != 0:
        raise InvalidPattern("unbalanced parentheses")
    return add_rule(name, f'"\\"" ({rule}) "\\""')
