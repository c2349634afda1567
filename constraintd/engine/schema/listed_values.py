# The extended dialect's reading of `const` / `enum` beside other keywords (schema/extended.py): the listed
# values the other keywords allow, checked here, value by value.
#
# Contract: `allowed_values(schema, values)` returns the values of `values` (the const, or the enum's) that
# every keyword beside them allows, in their order, where each such keyword is one read here (`type`,
# `enum` beside a const, minLength / maxLength, minimum / maximum and their exclusive forms, draft 4's too,
# minItems / maxItems, minProperties / maxProperties) or an annotation; None where another keyword is beside
# them (the default reading and its report then hold). Equality and types are JSON Schema's (`canonical`,
# `json_type`: 1.0 is an integer); a string's length counts code points.
# Invariants: a pure function of JSON values.
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

from constraintd.engine.schema.json_text import JsonValue, canonical, json_type
from constraintd.engine.schema.keywords import Enforcement, keyword_of

__all__ = ["READ", "VALUE_CHECKS", "allowed_values", "number_of"]

_Schema = Mapping[str, JsonValue]


def number_of(value: JsonValue) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _type(schema: _Schema, value: JsonValue) -> bool | None:
    declared = schema["type"]
    listed = declared if isinstance(declared, list) else [declared]
    if not all(isinstance(t, str) for t in listed):
        return None
    kind = json_type(value)
    return kind in listed or (kind == "integer" and "number" in listed)


def _enum(schema: _Schema, value: JsonValue) -> bool | None:
    listed = schema["enum"]
    return canonical(value) in set(map(canonical, listed)) if isinstance(listed, list) else None


def _size(key: str, below: bool) -> Callable[[_Schema, JsonValue], bool | None]:
    kinds = {"minLength": str, "maxLength": str, "minItems": list, "maxItems": list, "minProperties": dict,
             "maxProperties": dict}

    def check(schema: _Schema, value: JsonValue) -> bool | None:
        bound = number_of(schema[key])
        if bound is None:
            return None
        if not isinstance(value, kinds[key]):
            return True  # speaks of another type
        size = len(value)
        return size >= bound if below else size <= bound

    return check


def _bound(key: str, below: bool) -> Callable[[_Schema, JsonValue], bool | None]:
    exclusive = key.startswith("exclusive")
    flag_key = "exclusiveMinimum" if below else "exclusiveMaximum"

    def check(schema: _Schema, value: JsonValue) -> bool | None:
        raw = schema[key]
        if exclusive and isinstance(raw, bool):
            return True  # draft 4's flag: the inclusive bound's check reads it
        bound = number_of(raw)
        if bound is None:
            return None
        number = number_of(value)
        if number is None:
            return True  # speaks of another type
        strict = exclusive or schema.get(flag_key) is True
        if below:
            return number > bound if strict else number >= bound
        return number < bound if strict else number <= bound

    return check


# the keywords judged on a value alone (value_checks.py reads them too, beside the ones that recurse)
VALUE_CHECKS: Final[Mapping[str, Callable[[_Schema, JsonValue], bool | None]]] = {
    "type": _type,
    "enum": _enum,
    "minLength": _size("minLength", True),
    "maxLength": _size("maxLength", False),
    "minItems": _size("minItems", True),
    "maxItems": _size("maxItems", False),
    "minProperties": _size("minProperties", True),
    "maxProperties": _size("maxProperties", False),
    "minimum": _bound("minimum", True),
    "maximum": _bound("maximum", False),
    "exclusiveMinimum": _bound("exclusiveMinimum", True),
    "exclusiveMaximum": _bound("exclusiveMaximum", False),
}
READ: Final = frozenset({"const", *VALUE_CHECKS})


def allowed_values(schema: _Schema, values: Sequence[JsonValue]) -> list[JsonValue] | None:
    """The values every keyword beside them allows, or None where a keyword beside them is not read."""
    keys = [key for key in schema if key not in ("const", "enum") or ("const" in schema and key == "enum")]
    checks = []
    for key in keys:
        if keyword_of(key).enforcement is Enforcement.ANNOTATION and key not in VALUE_CHECKS:
            continue
        check = VALUE_CHECKS.get(key)
        if check is None:
            return None
        checks.append(check)
    allowed = []
    for value in values:
        verdicts = [check(schema, value) for check in checks]
        if any(verdict is None for verdict in verdicts):
            return None
        if all(verdicts):
            allowed.append(value)
    return allowed
