# Which `pattern`s have grammars that take, inside a string's JSON text, a character JSON writes only as an
# escape (a quote, a backslash, a control character).
#
# llama.cpp's translation of a pattern (schema/patterns.py) matches the string's JSON text between the
# quotes, character for character, not the string's value: where the pattern can match one of those
# characters (`.`, a negated class `[^...]`, a range over them, or the character itself), the grammar takes
# it as it is, so text that is no JSON string at all passes, and a `.*` can run past the string's closing
# quote into the rest of the document. The report names such patterns.
#
# Contract: `matches_unescaped(pattern)` is True when the pattern may match such a character; it reads the
# pattern conservatively (what it does not follow, such as an escaped range end, counts as True).
from __future__ import annotations

from typing import Final

__all__ = ["matches_unescaped"]

# escapes of a pattern that stand for one character (the rest stand for the character after the backslash)
_CHAR_ESCAPES: Final = {"n": "\n", "r": "\r", "t": "\t", "f": "\f", "v": "\v", "0": "\0"}
_HEX_LENGTHS: Final = {"x": 2, "u": 4, "U": 8}  # as GBNF reads them
_PATTERN_SYNTAX: Final = frozenset("()|*+?{},^$0123456789")


def _raw_hazard(char: str) -> bool:
    """A character the JSON text of a string never holds as itself: a quote, a backslash, a control."""
    return char in '"\\' or ord(char) < 0x20


def matches_unescaped(pattern: str) -> bool:
    """The pattern can match a quote, a backslash or a control character: its grammar takes that
    character as it is, inside the JSON text of the string, where JSON has an escape (or the string's end):
    `.` and `[^...]` do, as do such characters named in the pattern. Read conservatively: anything this
    scan does not follow counts as a hazard."""
    i, in_class, previous = 0, False, ""
    while i < len(pattern):
        char, i = pattern[i], i + 1
        if char == "\\" and i < len(pattern):
            kind = pattern[i]
            i += 1
            if kind in _HEX_LENGTHS:
                digits = pattern[i : i + _HEX_LENGTHS[kind]]
                try:
                    char = chr(int(digits, 16))
                except ValueError:
                    return True
                i += len(digits)
            else:
                char = _CHAR_ESCAPES.get(kind, kind)
        elif in_class:
            if char == "]":
                in_class, previous = False, ""
                continue
            if char == "-" and previous and i < len(pattern) and pattern[i] != "]":
                high = pattern[i]
                if high == "\\":
                    return True  # an escaped range end: not followed
                if any(_raw_hazard(c) for c in ('"', "\\") if previous <= c <= high) or previous < " ":
                    return True
                i += 1
                previous = ""
                continue
        elif char == "[":
            if pattern[i : i + 1] == "^":
                return True
            in_class, previous = True, ""
            continue
        elif char == ".":
            return True
        elif char in _PATTERN_SYNTAX:
            continue
        if _raw_hazard(char):
            return True
        previous = char
    return False
