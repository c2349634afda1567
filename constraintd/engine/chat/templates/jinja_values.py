# Values as llama.cpp's Jinja engine (common/jinja/value.cpp) writes them, where its text differs from
# Python's or Jinja2's: `tojson`, the `string` filter, and what `{{ value }}` prints.
#
# Contract:
# - `llama_json` writes a value as `tojson` does (value_to_json): keys in their own order, ", " and ": "
#   unless told otherwise (with indent: "," and newlines), non-ASCII kept unless ensure_ascii (then
#   \\uXXXX, surrogate pairs past the BMP), floats as C++'s ostream writes a double.
# - `llama_string` is the `string` filter: numbers as JSON, booleans and none as Python writes them, lists
#   and mappings as `llama_repr` (Python's shape, strings quoted with ' and not escaped; a string holding
#   a ' as JSON).
# - `output_text` is what `{{ value }}` prints: none, undefined and mappings print nothing, a list prints
#   its items one after the other, a float as std::to_string without its trailing zeros.
# - `llama_values` gives a value's lists and mappings llama.cpp's equality (`LlamaArray`, `LlamaObject`):
#   two of them are equal only where both hold nothing but scalars (llama.cpp's "hashable"), item by item
#   in order; one holding a list or a mapping equals nothing, itself included.
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "LlamaArray", "LlamaObject", "llama_json", "llama_repr", "llama_string", "llama_values", "output_text",
]


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _string(text: str, ensure_ascii: bool) -> str:
    out = ['"']
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif char < " ":
            out.append(f"\\u{ord(char):04x}")
        elif ensure_ascii and char > "\x7f":
            code = ord(char)
            if code > 0xFFFF:
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _number(value: float) -> str:
    # C++'s ostream << double: six significant digits, %g style
    if math.isnan(value) or math.isinf(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return f"{value:g}"


def llama_json(
    value: Any, *, indent: int | None = None, separators: Sequence[str] | None = None,
    ensure_ascii: bool = False, level: int = 0,
) -> str:
    """`value` as llama.cpp's Jinja `tojson` writes it (value_to_json): keys in their own order."""
    width = -1 if indent is None else indent
    item_sep = separators[0] if separators else (", " if width < 0 else ",")
    key_sep = separators[1] if separators and len(separators) > 1 else ": "
    newline = "\n" if width >= 0 else ""
    pad = " " * (level * width) if width > 0 else ""
    inner = pad + (" " * width if width > 0 else "")

    def nested(item: Any) -> str:
        return llama_json(item, indent=indent, separators=(item_sep, key_sep), ensure_ascii=ensure_ascii,
                          level=level + 1)

    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, str):
        return _string(value, ensure_ascii)
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        items = [inner + _string(str(key), ensure_ascii) + key_sep + nested(item)
                 for key, item in value.items()]
        return "{" + newline + (item_sep + newline).join(items) + newline + pad + "}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        items = [inner + nested(item) for item in value]
        return "[" + newline + (item_sep + newline).join(items) + newline + pad + "]"
    return "null"  # undefined, and anything that is no JSON value


def _float_text(value: float) -> str:
    # std::to_string (six decimals), trailing zeros cut, one kept after the point
    text = f"{value:f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def llama_repr(value: Any) -> str:
    """A value as llama.cpp's Jinja writes it inside a list or mapping's text: a string quoted with ' (as
    JSON where it holds a '), True / False / None, lists and mappings in Python's shape."""
    if isinstance(value, str):
        return _string(value, False) if "'" in value else f"'{value}'"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{llama_repr(key)}: {llama_repr(item)}" for key, item in value.items()) + "}"
    if isinstance(value, tuple):
        return "(" + ", ".join(llama_repr(item) for item in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(llama_repr(item) for item in value) + "]"
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        return _float_text(value)
    return str(value) if isinstance(value, int) else "Undefined"


def llama_string(value: Any) -> str:
    """`value|string` in llama.cpp's Jinja: a number as JSON, a list or mapping as `llama_repr`."""
    if isinstance(value, str):
        return value
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return llama_json(value)
    return llama_repr(value)


def output_text(value: Any) -> str:
    """What llama.cpp's Jinja prints for `{{ value }}`: none, undefined and mappings print nothing, a list
    prints its items one after the other, a float as std::to_string without its trailing zeros."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, (list, tuple)):
        return "".join(output_text(item) for item in value)
    return ""


def _scalars(items: Any) -> bool:
    return all(item is None or isinstance(item, (str, int, float)) for item in items)


def _equivalent(left: Any, right: Any) -> bool:
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        if not (_scalars(left.values()) and _scalars(right.values())) or len(left) != len(right):
            return False
        return all(a == b for a, b in zip(left.items(), right.items(), strict=True))
    if not (_scalars(left) and _scalars(right)) or len(left) != len(right):
        return False
    return all(a == b for a, b in zip(left, right, strict=True))


class LlamaObject(dict[Any, Any]):
    """A mapping with llama.cpp's equality (see the module's contract)."""

    __hash__ = None  # a mapping is no key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and _equivalent(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)


class LlamaArray(list[Any]):
    """A list with llama.cpp's equality (see the module's contract)."""

    __hash__ = None  # a list is no key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, list) and _equivalent(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)


def llama_values(value: Any) -> Any:
    """`value` (JSON data) with its lists and mappings compared as llama.cpp compares them."""
    if isinstance(value, Mapping):
        return LlamaObject({key: llama_values(item) for key, item in value.items()})
    if isinstance(value, list):
        return LlamaArray([llama_values(item) for item in value])
    return value
