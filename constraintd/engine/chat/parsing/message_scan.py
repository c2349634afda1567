# The scan llama.cpp's PEG chat parser is ported as (message_parser.py, tagged_message_parser.py): a text read
# from a position, with what the mapper (common_chat_peg_mapper) has gathered so far.
#
# Contract:
# - A parser is a function of the scan that advances `pos` on success, raises ScanFail where llama.cpp's
#   parser fails (the caller puts `pos` back where its choice or optional began, and drops what the failed
#   branch gathered) and NeedMore where it stops for more input at the end of the text (lenient parsing:
#   what was gathered before it stands, and the parse ends there).
# - A failure leaves `pos` where llama.cpp's failed result ends: a sequence's where its failing part's
#   ends, a choice's and a literal's where they began (a partial parse reads that end).
# - `content`, `reasoning` and `calls` are what the mapper would hold for the nodes read so far.
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["SPACE", "NeedMore", "ParsedToolCall", "Scan", "ScanFail", "brace_depth"]

SPACE = " \t\n\v\f\r"  # C's isspace


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    """One tool call: the function's name, its arguments as the JSON text written, and its id (or "")."""

    name: str
    arguments: str
    id: str = ""

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "arguments": self.arguments, "id": self.id}


def brace_depth(text: str) -> int:
    """The `{` of a JSON text not yet closed, outside its strings (json_brace_depth: how many `}` the
    mapper appends to arguments cut short)."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\" and in_string:
            escaped = True
        elif char == '"':
            in_string = not in_string
        elif not in_string and char in "{}":
            depth += 1 if char == "{" else -1
    return depth


class NeedMore(Exception):
    """llama.cpp's parser reached the text's end while reading (NEED_MORE_INPUT): what was read stands."""


class ScanFail(Exception):
    """llama.cpp's parser does not match here (FAIL)."""


class Scan:
    """A text, the position read to, and what was gathered."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ParsedToolCall] = []
        self.partial = ""  # the arguments read when the text ends inside them

    def space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in SPACE:
            self.pos += 1

    def literal(self, word: str) -> None:
        if self.text.startswith(word, self.pos):
            self.pos += len(word)
            return
        rest = self.text[self.pos:]
        if word.startswith(rest):
            raise NeedMore  # the text ends inside the literal
        raise ScanFail

    def optspace(self, tag: str) -> None:
        # common_chat_peg_builder::optspace: the tag's whitespace around its core optional, char by char
        lead = len(tag) - len(tag.lstrip(SPACE))
        core_end = len(tag) if lead == len(tag) else len(tag.rstrip(SPACE))
        for c in tag[:lead]:
            self.optional(lambda c=c: self.literal(c))
        self.literal(tag[lead:core_end])
        for c in tag[core_end:]:
            self.optional(lambda c=c: self.literal(c))

    def optional(self, parse: Any) -> None:
        start = self.pos
        marks = (len(self.content), len(self.reasoning), len(self.calls))
        try:
            parse()
        except ScanFail:
            self.pos = start
            del self.content[marks[0]:], self.reasoning[marks[1]:], self.calls[marks[2]:]

    def until(self, delimiters: Sequence[str]) -> str:
        # common_peg_until_parser: up to the first delimiter, or one begun at the end of the text
        start = self.pos
        for at in range(start, len(self.text)):
            rest = self.text[at:]
            if any(rest.startswith(d) or d.startswith(rest) for d in delimiters if d):
                self.pos = at
                return self.text[start:at]
        self.pos = len(self.text)
        raise NeedMore  # lenient: more text might hold a delimiter

    def end(self) -> None:
        if self.pos != len(self.text):
            raise ScanFail

    def json_value(self) -> str:
        decoder = json.JSONDecoder(parse_constant=_no_constant)
        try:
            _, end = decoder.raw_decode(self.text, self.pos)
        except json.JSONDecodeError as exc:
            # a value the text ends inside: read so far, as llama.cpp's lenient JSON parser reads it
            if exc.pos >= len(self.text.rstrip(SPACE)) or exc.msg.startswith("Unterminated string"):
                self.partial = self.text[self.pos:].rstrip(SPACE)
                self.pos = len(self.text)
                raise NeedMore from None
            raise ScanFail from None
        except ValueError:
            raise ScanFail from None
        value = self.text[self.pos:end]
        self.pos = end
        return value


def _no_constant(name: str) -> Any:
    raise ValueError(name)  # NaN and Infinity are no JSON
