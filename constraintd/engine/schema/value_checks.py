# Whether one JSON value is valid against a schema, for the extended dialect's readings that come down to a
# finite list of values (an enum or const beside other keywords, or in one part of an allOf): the grammar
# then lists the values that pass, and nothing else.
#
# Contract: `validates(schema, value, root)` is True or False where every keyword met on the way is one
# read here (JSON Schema 2020-12's meaning, draft 4's boolean exclusives and draft 7's `dependencies` and
# array `items` too), and None where one is not (`pattern`, `format`, `patternProperties`, `$ref` outside
# the document, the unevaluated and dynamic keywords ...): a caller then keeps its own reading and its
# report. An unknown keyword, or one the keyword table calls an annotation, is skipped (2020-12, 6.5).
# Equality and types are JSON Schema's (`canonical`, `json_type`: 1.0 is an integer); a string's length
# counts code points; multipleOf of a fraction is decided only where the numbers as written and their
# doubles agree.
# Invariants: a pure function; `$ref` chains are followed at most `MAX_DEPTH` deep (then None).
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Final

from constraintd.engine.schema.json_text import JsonValue, canonical
from constraintd.engine.schema.keywords import Enforcement, keyword_of
from constraintd.engine.schema.listed_values import VALUE_CHECKS, number_of

__all__ = ["MAX_DEPTH", "local_ref", "validates"]

MAX_DEPTH: Final = 64
_Schema = Mapping[str, JsonValue]
_Verdict = bool | None


def _all(verdicts: list[_Verdict]) -> _Verdict:
    # None (not read) wins over False: the caller must not trust a verdict built on a keyword not read
    if any(verdict is None for verdict in verdicts):
        return None
    return all(verdicts)


def local_ref(root: JsonValue, ref: JsonValue) -> JsonValue | None:
    """The subschema a `$ref` of this document names ("#" or a JSON pointer "#/..."); None for any other
    reference, or a pointer that leads nowhere."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    target = root
    for raw in ref[2:].split("/") if ref != "#" else ():
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and token in target:
            target = target[token]
        elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
            target = target[int(token)]
        else:
            return None
    return target


class _Checker:
    def __init__(self, root: JsonValue) -> None:
        self.root = root

    def resolve(self, ref: JsonValue) -> JsonValue | None:
        return local_ref(self.root, ref)

    def check(self, schema: JsonValue, value: JsonValue, depth: int = 0) -> _Verdict:
        if depth > MAX_DEPTH:
            return None
        if isinstance(schema, bool):
            return schema
        if not isinstance(schema, dict):
            return None
        verdicts: list[_Verdict] = []
        for key in schema:
            check = _KEYWORDS.get(key)
            if check is None:
                if key in _READ_BY_OTHERS or keyword_of(key).enforcement is Enforcement.ANNOTATION:
                    continue
                return None
            verdict = check(self, schema, value, depth)
            if verdict is None:
                return None
            verdicts.append(verdict)
        return all(verdicts)


_Check = Callable[[_Checker, _Schema, JsonValue, int], _Verdict]


def _ref(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
    target = checker.resolve(schema["$ref"])
    return None if target is None else checker.check(target, value, depth + 1)


def _on_value(check: Callable[[_Schema, JsonValue], _Verdict]) -> _Check:
    """A check of listed_values.py's, judged on the value alone, in this module's form."""
    return lambda checker, schema, value, depth: check(schema, value)


def _const(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
    return canonical(value) == canonical(schema["const"])


def _multiple_of(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
    divisor, number = number_of(schema["multipleOf"]), number_of(value)
    if divisor is None or divisor <= 0:
        return None
    if number is None:
        return True
    if isinstance(number, int) and isinstance(divisor, int):
        return number % divisor == 0
    if not (math.isfinite(number) and math.isfinite(divisor)):
        return None
    # validators part here: the numbers as written (0.3 is three times 0.1) or their doubles' quotient
    # (0.3 / 0.1 is 2.9999999999999996): a verdict only where both readings give it
    written = (Fraction(repr(number)) / Fraction(repr(divisor))).denominator == 1
    quotient = number / divisor
    return written if written == (math.isfinite(quotient) and quotient.is_integer()) else None


def _not(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
    verdict = checker.check(schema["not"], value, depth + 1)
    return None if verdict is None else not verdict


def _parts(schema: _Schema, key: str) -> list[JsonValue] | None:
    parts = schema[key]
    return parts if isinstance(parts, list) and parts else None


def _all_of(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
    parts = _parts(schema, "allOf")
    return None if parts is None else _all([checker.check(part, value, depth + 1) for part in parts])


def _any_of(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
    parts = _parts(schema, "anyOf")
    if parts is None:
        return None
    verdicts = [checker.check(part, value, depth + 1) for part in parts]
    return None if None in verdicts else any(verdicts)


def _one_of(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
    parts = _parts(schema, "oneOf")
    if parts is None:
        return None
    verdicts = [checker.check(part, value, depth + 1) for part in parts]
    return None if None in verdicts else verdicts.count(True) == 1


def _conditional(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
    condition = checker.check(schema["if"], value, depth + 1)
    if condition is None:
        return None
    branch = "then" if condition else "else"
    return checker.check(schema[branch], value, depth + 1) if branch in schema else True


def _object_members(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
    # properties and additionalProperties together (patternProperties beside them is not read)
    if not isinstance(value, dict):
        return True
    if "patternProperties" in schema:
        return None
    declared = schema.get("properties", {})
    if not isinstance(declared, dict):
        return None
    extra = schema.get("additionalProperties", True)
    verdicts = [checker.check(declared.get(key, extra), item, depth + 1)
                for key, item in value.items()]
    return _all(verdicts)


def _required(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
    names = schema["required"]
    if not isinstance(names, list):
        return None
    return not isinstance(value, dict) or all(name in value for name in names)


def _dependent(key: str) -> _Check:
    # dependentRequired (names), dependentSchemas (schemas), draft 7's dependencies (either)
    def check(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
        table = schema[key]
        if not isinstance(table, dict):
            return None
        if not isinstance(value, dict):
            return True
        verdicts: list[_Verdict] = []
        for name, then in table.items():
            if name not in value:
                continue
            if isinstance(then, list) and key != "dependentSchemas":
                verdicts.append(all(other in value for other in then))
            elif key != "dependentRequired":
                verdicts.append(checker.check(then, value, depth + 1))
            else:
                return None
        return _all(verdicts)

    return check


def _property_names(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
    if not isinstance(value, dict):
        return True
    return _all([checker.check(schema["propertyNames"], key, depth + 1) for key in value])


def _array_items(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
    # prefixItems, items (a schema, or draft 7's list) and additionalItems together
    if not isinstance(value, list):
        return True
    items = schema.get("items", True)
    prefix = schema.get("prefixItems", [])
    if isinstance(items, list):  # draft 7: a tuple, then additionalItems
        if "prefixItems" in schema:
            return None
        prefix, items = items, schema.get("additionalItems", True)
    if not isinstance(prefix, list):
        return None
    verdicts = [checker.check(prefix[i] if i < len(prefix) else items, item, depth + 1)
                for i, item in enumerate(value)]
    return _all(verdicts)


def _unique_items(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
    if schema["uniqueItems"] is not True or not isinstance(value, list):
        return True
    texts = [canonical(item) for item in value]
    return len(set(texts)) == len(texts)


def _contains(checker: _Checker, schema: _Schema, value: JsonValue, depth: int) -> _Verdict:
    if not isinstance(value, list):
        return True
    verdicts = [checker.check(schema["contains"], item, depth + 1) for item in value]
    if None in verdicts:
        return None
    low, high = number_of(schema.get("minContains", 1)), schema.get("maxContains")
    if low is None or (high is not None and number_of(high) is None):
        return None
    count = verdicts.count(True)
    return count >= low and (high is None or count <= high)  # type: ignore[operator]


_KEYWORDS: Final[Mapping[str, _Check]] = {
    "$ref": _ref,
    **{key: _on_value(check) for key, check in VALUE_CHECKS.items()},
    "const": _const,
    "multipleOf": _multiple_of,
    "not": _not,
    "allOf": _all_of,
    "anyOf": _any_of,
    "oneOf": _one_of,
    "if": _conditional,
    "properties": _object_members,
    "additionalProperties": _object_members,
    "required": _required,
    "dependentRequired": _dependent("dependentRequired"),
    "dependentSchemas": _dependent("dependentSchemas"),
    "dependencies": _dependent("dependencies"),
    "propertyNames": _property_names,
    "items": _array_items,
    "prefixItems": _array_items,
    "additionalItems": _array_items,
    "uniqueItems": _unique_items,
    "contains": _contains,
}
# keywords whose meaning another keyword's check reads (then / else without if, min/maxContains without
# contains: vacuous, as 2020-12 says)
_READ_BY_OTHERS: Final = frozenset({"then", "else", "minContains", "maxContains"})


def validates(schema: JsonValue, value: JsonValue, root: JsonValue = None) -> bool | None:
    """Whether `value` is valid against `schema` (a `$ref` resolved in `root`), or None where a keyword met
    on the way is not one this module reads."""
    return _Checker(root if root is not None else schema).check(schema, value)
