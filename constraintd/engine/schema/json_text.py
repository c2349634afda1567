# JSON read and printed as llama.cpp reads and prints it: nlohmann::ordered_json behind `common_json`.
#
# Contract:
# - `parse_json(text)` accepts what `nlohmann::ordered_json::parse` accepts (strict RFC 8259, a leading
#   UTF-8 byte-order mark skipped) and builds the same value: objects keep their keys in first-seen order,
#   a repeated key keeps its first place and takes its last value; an integer literal that fits
#   [-2**63, 2**64) is an `int`, any other number a `float` (so `2.0` stays a float and `2**64` becomes
#   1.8446744073709552e+19); a number that overflows a double is refused, as are lone surrogates.
#   Anything refused raises `SchemaError` (pointer `#`) with line and column; nothing else escapes.
# - `dump_json(value)` is `dump()` with no indent: no spaces, UTF-8 kept as is, control characters
#   escaped (`\n`, `\u001f` in lowercase hex), floats through `format_double`.
# - Nesting deeper than `MAX_JSON_DEPTH` and texts longer than `MAX_JSON_CHARS` are refused before parsing
#   (nlohmann has no depth limit; these bound the work and the stack of everything downstream).
#
# Value model: None, bool, int, float, str, list, dict[str, value]. `bool` is tested before `int`.
from __future__ import annotations

import json
import math
import re
from typing import Final, TypeAlias

from constraintd.engine.schema.float_text import format_double
from constraintd.errors import SchemaError

__all__ = [
    "MAX_JSON_CHARS",
    "MAX_JSON_DEPTH",
    "JsonValue",
    "canonical",
    "dump_json",
    "dump_string",
    "is_integer",
    "json_type",
    "parse_json",
    "to_int32",
    "to_int64",
]

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"

MAX_JSON_DEPTH: Final = 256
MAX_JSON_CHARS: Final = 8_000_000

_INT_MIN: Final = -(2**63)
_UINT_LIMIT: Final = 2**64
_STRING_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_ESCAPES: Final = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')


class _Refused(Exception):
    """Raised from inside json.loads hooks; turned into SchemaError with a position."""


def _max_depth(text: str) -> int:
    # Exact for valid JSON (no quote outside strings); for invalid JSON any count is fine, json.loads
    # refuses it anyway and RecursionError is caught as a refusal too.
    depth = deepest = 0
    for bracket in _BRACKET.finditer(_STRING_TOKEN.sub("", text)):
        if bracket.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _parse_int(token: str) -> int | float:
    # nlohmann: strtoull / strtoll first; outside their range, strtod of the same token.
    if len(token) <= 21:
        value = int(token)
        if _INT_MIN <= value < _UINT_LIMIT:
            return value
    return _parse_float(token)


def _parse_float(token: str) -> float:
    value = float(token)
    if math.isinf(value):
        raise _Refused(f"number overflow parsing '{token}'")
    return value


def _parse_constant(token: str) -> float:
    raise _Refused(f"invalid literal '{token}'")


def _object(pairs: list[tuple[str, JsonValue]]) -> dict[str, JsonValue]:
    value: dict[str, JsonValue] = {}
    for key, item in pairs:
        value[key] = item  # a repeated key: first place, last value (ordered_map::operator[])
    return value


def _has_lone_surrogate(value: JsonValue) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if any(0xD800 <= ord(c) <= 0xDFFF for c in item):
                return True
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
    return False


def _where(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"line {line}, column {column}"


def parse_json(text: str) -> JsonValue:
    """Read a JSON text as llama.cpp's `common_json::parse` does.

    Raises:
        SchemaError: the text is not JSON (or nests deeper than `MAX_JSON_DEPTH`); pointer `#`.
    """
    if len(text) > MAX_JSON_CHARS:
        raise SchemaError(f"invalid JSON: the text is longer than {MAX_JSON_CHARS} characters")
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SchemaError(f"invalid JSON: not valid UTF-8 at {_where(text, exc.start)}") from None
    depth = _max_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise SchemaError(f"invalid JSON: nested {depth} deep, deeper than {MAX_JSON_DEPTH}")
    try:
        value: JsonValue = json.loads(
            text, object_pairs_hook=_object, parse_int=_parse_int, parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except json.JSONDecodeError as exc:
        raise SchemaError(f"invalid JSON: {exc.msg} at {_where(text, exc.pos)}") from None
    except _Refused as exc:
        raise SchemaError(f"invalid JSON: {exc}") from None
    except RecursionError:
        raise SchemaError("invalid JSON: nested too deep") from None
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
        raise SchemaError("invalid JSON: a \\u escape names a lone UTF-16 surrogate")
    return value


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or f"\\u{ord(char):04x}"


def dump_string(value: str) -> str:
    """A string as nlohmann's `dump()` writes it, quotes included."""
    return '"' + _NEEDS_ESCAPE.sub(_escape, value) + '"'


def dump_json(value: JsonValue) -> str:
    """The compact text nlohmann's `dump()` (indent -1) gives the value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_double(value)
    if isinstance(value, str):
        return dump_string(value)
    if isinstance(value, list):
        return "[" + ",".join(dump_json(item) for item in value) + "]"
    return "{" + ",".join(dump_string(key) + ":" + dump_json(item) for key, item in value.items()) + "}"


def is_integer(value: JsonValue) -> bool:
    """nlohmann's `is_number_integer()`: an integer literal (signed or unsigned), never a bool or float."""
    return isinstance(value, int) and not isinstance(value, bool)


def to_int64(value: int) -> int:
    """`get<int64_t>()` of an integer: an unsigned value above 2**63 - 1 wraps around, as static_cast does."""
    return (value + 2**63) % 2**64 - 2**63


def to_int32(value: int) -> int:
    """`get<int>()` of an integer: the low 32 bits, as a signed int (static_cast on two's complement)."""
    return (value + 2**31) % 2**32 - 2**31


def json_type(value: JsonValue) -> str:
    """The JSON type of a value; an integral number is "integer" (2020-12: 1.0 is an integer)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def canonical(value: JsonValue) -> str:
    """A value's text up to JSON Schema's equality: object keys sorted, an integral number as an integer."""

    def normal(item: JsonValue) -> JsonValue:
        if isinstance(item, float) and item.is_integer():
            return int(item)
        if isinstance(item, list):
            return [normal(x) for x in item]
        if isinstance(item, dict):
            return {key: normal(x) for key, x in item.items()}
        return item

    return json.dumps(normal(value), sort_keys=True)
