# The fixed pieces of GBNF llama.cpp's JSON-schema converter writes (common/json-schema-to-grammar.cpp):
# its built-in rules, the whitespace rule, string literals, the "any string but these keys" rule, and the
# byte strings they are made of.
#
# Contract: every text here is character for character llama.cpp's. Texts are byte strings held in `str`,
# one character per UTF-8 byte (latin-1), because llama.cpp builds and sorts them as bytes; `to_bytes`
# converts text in, `from_bytes` converts back for messages.
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "INVALID_RULE_CHARS",
    "PRIMITIVE_RULES",
    "RESERVED_NAMES",
    "SPACE_RULE",
    "STRING_FORMAT_RULES",
    "BuiltinRule",
    "format_literal",
    "from_bytes",
    "from_utf8",
    "is_utf8",
    "not_strings",
    "to_bytes",
]

SPACE_RULE: Final = '| " " | "\\n"{1,2} [ \\t]{0,20}'


@dataclass(frozen=True, slots=True)
class BuiltinRule:
    content: str
    deps: tuple[str, ...] = ()


PRIMITIVE_RULES: Final = {
    "boolean": BuiltinRule('("true" | "false")'),
    "decimal-part": BuiltinRule("[0-9]{1,16}"),
    "integral-part": BuiltinRule("[0] | [1-9] [0-9]{0,15}"),
    "number": BuiltinRule('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
                          ("integral-part", "decimal-part")),
    "integer": BuiltinRule('("-"? integral-part)', ("integral-part",)),
    "value": BuiltinRule("object | array | string | number | boolean | null",
                         ("object", "array", "string", "number", "boolean", "null")),
    "object": BuiltinRule(
        '"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"',
        ("string", "value"),
    ),
    "array": BuiltinRule('"[" space ( value ("," space value)* )? space "]"', ("value",)),
    "uuid": BuiltinRule('"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
                        '[0-9a-fA-F]{12} "\\""'),
    "char": BuiltinRule('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})'),
    "string": BuiltinRule('"\\"" char* "\\""', ("char",)),
    "null": BuiltinRule('"null"'),
}

STRING_FORMAT_RULES: Final = {
    "date": BuiltinRule('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )'),
    "time": BuiltinRule('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
                        '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )'),
    "date-time": BuiltinRule('date "T" time', ("date", "time")),
    "date-string": BuiltinRule('"\\"" date "\\""', ("date",)),
    "time-string": BuiltinRule('"\\"" time "\\""', ("time",)),
    "date-time-string": BuiltinRule('"\\"" date-time "\\""', ("date-time",)),
}

RESERVED_NAMES: Final = frozenset({"root", *PRIMITIVE_RULES, *STRING_FORMAT_RULES})
INVALID_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")
_LITERAL_ESCAPES: Final = str.maketrans({"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"})
def to_bytes(text: str) -> str:
    """A str as the byte string llama.cpp holds (one character per UTF-8 byte)."""
    return text.encode("utf-8").decode("latin-1")


def from_bytes(data: str) -> str:
    """A byte string (one character per byte) back to text, undecodable bytes replaced (for messages)."""
    return data.encode("latin-1").decode("utf-8", "replace")


def from_utf8(data: str) -> str:
    """A byte string (one character per byte) of valid UTF-8 back to its text."""
    return data.encode("latin-1").decode("utf-8")


def is_utf8(data: str) -> bool:
    """Whether a byte string (one character per byte) is valid UTF-8."""
    try:
        data.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def format_literal(literal: str) -> str:
    """A GBNF string literal: quotes added, CR, LF, quote and backslash escaped (nothing else)."""
    return '"' + literal.translate(_LITERAL_ESCAPES) + '"'


def not_strings(strings: Sequence[str], char_rule: str) -> str:
    """A JSON string rule matching any string but these (byte strings); llama.cpp's trie walk, unrolled."""
    children: list[dict[int, int]] = [{}]
    ends = [False]
    for word in strings:
        node = 0
        for cpt in map(ord, word.encode("latin-1").decode("utf-8")):
            if cpt not in children[node]:
                children.append({})
                ends.append(False)
                children[node][cpt] = len(children) - 1
            node = children[node][cpt]
        ends[node] = True
    out = ['["] ( ']
    # frames: (trie node, its children still to write, last first; the characters written so far)
    stack: list[tuple[int, list[tuple[int, int]], list[str]]] = [
        (0, sorted(children[0].items(), reverse=True), [])
    ]
    while stack:
        node, pending, rejects = stack[-1]
        if not pending:
            if children[node]:
                out.append(f' | [^"{"".join(rejects)}] {char_rule}*')
            stack.pop()
            if stack:
                out.append(")")
            continue
        cpt, child = pending.pop()
        char = to_bytes(chr(cpt))
        if rejects:
            out.append(" | ")
        rejects.append(char)
        out.append(f"[{char}]")
        if children[child]:
            out.append(" (")
            stack.append((child, sorted(children[child].items(), reverse=True), []))
        else:
            out.append(f" {char_rule}+")
    out.append(" )" + ("" if ends[0] else "?") + ' ["]')
    return "".join(out)
