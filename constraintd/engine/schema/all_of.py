# The extended dialect's reading of `allOf` (schema/extended.py): the parts merged into one schema where the
# merge is exact, so the builder then reads one schema as it reads any other (and the report judges it).
#
# Contract: `merged_all_of(schema, root)` returns, for a schema object with an `allOf`, one schema object
# without it that the same values are valid against, or None where it cannot say so (the default reading
# of allOf, and its report, then hold). The parts are the schema's other keywords, each part of its allOf,
# and theirs in turn (a part that is only a `$ref`, with annotations, is its target in `root`):
# - where a part lists values (`const`, `enum`), the result lists those of them valid against the whole
#   schema (schema/value_checks.py), value by value; None where a keyword on the way is not read there, or
#   where no value is left;
# - otherwise keyword by keyword (`_MERGES`): `type` intersected (an integer is a number); bounds, lengths
#   and counts the tightest; `required` and `dependentRequired` united; the same `pattern` / `format` /
#   `const`; integer `multipleOf` by their least common multiple; `uniqueItems` if any; several `not` as
#   the `not` of their anyOf; `items` (a schema) and `propertyNames` as the allOf of theirs, merged in turn
#   where the builder meets them;
# - objects: a property's schema is the allOf of what each part says of that name (its own schema, or the
#   part's additionalProperties where the part does not declare it); additionalProperties the allOf of the
#   parts'; a name some part forbids (`false`) is left out only where the merge's other keys are closed;
# - a keyword whose meaning spans other keywords or the parts themselves (patternProperties, anyOf, oneOf,
#   if/then/else, contains, dependentSchemas, dependencies ...) is taken only from a part that is the only
#   one to speak of it; the unevaluated keywords (which see into allOf's parts) never.
# Invariants: a pure function of JSON values; the result holds no `allOf` at its top (nested schemas may).
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from constraintd.engine.schema.json_text import JsonValue, canonical
from constraintd.engine.schema.keywords import Enforcement, keyword_of
from constraintd.engine.schema.value_checks import local_ref, validates

__all__ = ["merged_all_of"]

_Schema = Mapping[str, JsonValue]
_MAX_PARTS: Final = 64
_MAX_REFS: Final = 32


class _NotExact(Exception):
    """The parts do not merge exactly."""


def _resolve(root: JsonValue, ref: JsonValue) -> JsonValue:
    target = local_ref(root, ref)
    if target is None:  # a reference elsewhere, or nowhere (a JSON null target is no schema either)
        raise _NotExact
    return target


def _annotation(key: str) -> bool:
    return keyword_of(key).enforcement is Enforcement.ANNOTATION


def _flatten(schema: JsonValue, root: JsonValue, parts: list[dict[str, JsonValue]], refs: int) -> None:
    if schema is True:
        return
    if not isinstance(schema, dict) or len(parts) > _MAX_PARTS:
        raise _NotExact  # false, or not a schema: left to the default reading
    if "$ref" in schema:
        if any(not _annotation(key) for key in schema if key != "$ref") or refs >= _MAX_REFS:
            raise _NotExact  # siblings of $ref mean different things in different drafts
        _flatten(_resolve(root, schema["$ref"]), root, parts, refs + 1)
        return
    own = {key: value for key, value in schema.items() if key != "allOf"}
    if own:
        parts.append(own)
    if "allOf" in schema:
        nested = schema["allOf"]
        if not isinstance(nested, list) or not nested:
            raise _NotExact
        for part in nested:
            _flatten(part, root, parts, refs)


def _all_of(schemas: Sequence[JsonValue]) -> JsonValue:
    kept = [schema for schema in schemas if schema is not True and schema != {}]
    if any(schema is False for schema in kept):
        return False
    unique = list({canonical(schema): schema for schema in kept}.values())
    return True if not unique else unique[0] if len(unique) == 1 else {"allOf": unique}


def _types(values: Sequence[JsonValue]) -> JsonValue:
    sets = []
    for value in values:
        listed = value if isinstance(value, list) else [value]
        if not all(isinstance(kind, str) for kind in listed):
            raise _NotExact
        sets.append([kind for kind in listed if isinstance(kind, str)])
    kept = sets[0]
    for other in sets[1:]:
        meet = [kind for kind in kept if kind in other]
        if "integer" not in meet and (("integer" in kept and "number" in other)
                                      or ("number" in kept and "integer" in other)):
            meet.append("integer")  # an integer is a number
        kept = meet
    if not kept:
        raise _NotExact  # no value at all: left to the default reading (and its report)
    return kept[0] if len(kept) == 1 else list[JsonValue](kept)


def _number(value: JsonValue) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _NotExact
    return value


def _tightest(pick: Callable[[list[int | float]], int | float]) -> Callable[[Sequence[JsonValue]], JsonValue]:
    def merge(values: Sequence[JsonValue]) -> JsonValue:
        return pick([_number(value) for value in values])

    return merge


def _same(values: Sequence[JsonValue]) -> JsonValue:
    if len({canonical(value) for value in values}) != 1:
        raise _NotExact
    return values[0]


def _union(values: Sequence[JsonValue]) -> JsonValue:
    names: dict[str, None] = {}
    for value in values:
        if not isinstance(value, list):
            raise _NotExact
        names.update((name, None) for name in value if isinstance(name, str))
    return list(names)


def _multiple(values: Sequence[JsonValue]) -> JsonValue:
    if len({canonical(value) for value in values}) == 1:
        return values[0]
    if not all(isinstance(value, int) and not isinstance(value, bool) and value > 0 for value in values):
        raise _NotExact
    return math.lcm(*(value for value in values if isinstance(value, int)))


def _dependent_required(values: Sequence[JsonValue]) -> JsonValue:
    merged: dict[str, JsonValue] = {}
    for value in values:
        if not isinstance(value, dict):
            raise _NotExact
        for name, names in value.items():
            merged[name] = _union([merged.get(name, []), names])
    return merged


def _negations(values: Sequence[JsonValue]) -> JsonValue:
    return values[0] if len(values) == 1 else {"anyOf": list(values)}


def _items(values: Sequence[JsonValue]) -> JsonValue:
    if any(isinstance(value, list) for value in values):
        raise _NotExact  # draft 7's tuples: their lengths and additionalItems interact
    return _all_of(values)


_MERGES: Final[Mapping[str, Callable[[Sequence[JsonValue]], JsonValue]]] = {
    "type": _types,
    "minimum": _tightest(max),
    "exclusiveMinimum": _tightest(max),
    "maximum": _tightest(min),
    "exclusiveMaximum": _tightest(min),
    "minLength": _tightest(max),
    "maxLength": _tightest(min),
    "minItems": _tightest(max),
    "maxItems": _tightest(min),
    "minProperties": _tightest(max),
    "maxProperties": _tightest(min),
    "required": _union,
    "dependentRequired": _dependent_required,
    "pattern": _same,
    "format": _same,
    "const": _same,
    "multipleOf": _multiple,
    "uniqueItems": lambda values: any(value is True for value in values),
    "not": _negations,
    "items": _items,
    "propertyNames": _all_of,
}
# keywords read with others of their part; a group more than one part speaks of does not merge (objects'
# members are merged on their own, below)
_GROUPS: Final = (
    frozenset({"properties", "additionalProperties", "patternProperties"}),
    frozenset({"items", "prefixItems", "additionalItems"}),
    frozenset({"contains", "minContains", "maxContains"}),
    frozenset({"if", "then", "else"}),
)
_NEVER: Final = frozenset({"unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"})
_MEMBERS: Final = _GROUPS[0]


def _members(parts: Sequence[_Schema], merged: dict[str, JsonValue]) -> None:
    speaking = [part for part in parts if any(key in part for key in _MEMBERS)]
    if len(speaking) <= 1:
        merged.update((key, value) for part in speaking for key, value in part.items() if key in _MEMBERS)
        return
    if any("patternProperties" in part for part in speaking):
        raise _NotExact
    declared: list[Mapping[str, JsonValue]] = []
    for part in speaking:
        own = part.get("properties", {})
        if not isinstance(own, dict):
            raise _NotExact
        declared.append(own)
    names = list({name: None for properties in declared for name in properties})
    others = _all_of([part["additionalProperties"] for part in speaking if "additionalProperties" in part])
    required = {name for part in parts if isinstance(part.get("required"), list)
                for name in part["required"]}  # type: ignore[union-attr]
    properties: dict[str, JsonValue] = {}
    for name in names:
        value = _all_of([own[name] if name in own else part.get("additionalProperties", True)
                         for own, part in zip(declared, speaking, strict=True)])
        if value is False:
            # absent is the only way: where other keys are closed, leaving it out says so
            if others is not False or name in required:
                raise _NotExact
            continue
        properties[name] = {} if value is True else value
    merged["properties"] = properties
    if others is not True:
        merged["additionalProperties"] = others


def _listed(parts: Sequence[_Schema], schema: _Schema, root: JsonValue) -> dict[str, JsonValue] | None:
    for part in parts:
        values = [part["const"]] if "const" in part else part.get("enum")
        if isinstance(values, list) and values:
            break
    else:
        return None
    kept = []
    for value in values:
        verdict = validates(dict(schema), value, root)
        if verdict is None:
            raise _NotExact
        if verdict:
            kept.append(value)
    if not kept:
        raise _NotExact
    return {"enum": kept}


def merged_all_of(schema: _Schema, root: JsonValue) -> dict[str, JsonValue] | None:
    """One schema without `allOf` the same values are valid against as `schema`, or None where the merge
    would not be exact (see the module's contract)."""
    try:
        parts: list[dict[str, JsonValue]] = []
        _flatten(dict(schema), root, parts, 0)
        listed = _listed(parts, schema, root)
        if listed is not None:
            return listed
        merged: dict[str, JsonValue] = {}
        keys = list({key: None for part in parts for key in part})
        if any(key in _NEVER for key in keys):
            raise _NotExact
        if len(parts) > 1 and any(isinstance(part.get(key), bool) for part in parts
                                  for key in ("exclusiveMinimum", "exclusiveMaximum")):
            raise _NotExact  # draft 4's flags speak of their own part's bound
        for group in _GROUPS[1:]:
            if sum(any(key in part for key in group) for part in parts) > 1 and not (
                    group is _GROUPS[1] and all(set(part) & group <= {"items"} for part in parts)):
                raise _NotExact
        _members(parts, merged)
        for key in keys:
            if key in _MEMBERS:
                continue
            values = [part[key] for part in parts if key in part]
            merge = _MERGES.get(key)
            if len(values) == 1 or _annotation(key):
                merged[key] = values[0]
            elif merge is not None:
                merged[key] = merge(values)
            else:
                merged[key] = _same(values)  # anyOf, oneOf ... said twice alike, else not merged
        return merged
    except _NotExact:
        return None
