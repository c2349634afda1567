# The extended dialect's reading of a oneOf / anyOf beside object keywords (schema/extended.py): the
# keywords beside it merged into each alternative, where the merge is exact.
#
# Contract:
# - `merged_alternatives(schema, key)` reads `{"type": "object", "properties": ..., "required": ...,
#   key: [alternative, ...]}` (the keywords beside `key` are the base) and returns, for each alternative, the
#   schema of the objects valid for the base and that alternative (a plain JSON schema, read by the builder
#   as any other), with the names such an object must not hold (`Merged.forbidden`); or None where it cannot
#   merge exactly, and the dialect keeps the converter's reading (and its report).
# - An alternative merges where it is an object schema of `required`, `properties`, `type` "object" and
#   annotations only, and each property it declares meets the base's exactly: the same schema, one of the
#   two without a keyword that validates, or const / enum values under the base's `type` or enum (the
#   values both allow). Its required names the base does not declare are declared, of additionalProperties'
#   schema (any value where the base says nothing of other keys); where the base allows no other key, the
#   alternative admits no object and is left out.
# - oneOf: a document valid for two alternatives is invalid. Two merged alternatives a required property of
#   which has disjoint listed values (const / enum) in each are disjoint already. Otherwise an alternative j
#   whose only constraint beyond the base is its required names is excluded from alternative i by requiring
#   one of them absent: alternative i splits into one object per choice (`MAX_SPLITS` at most), each with
#   its chosen names forbidden. An alternative every choice of which is impossible admits nothing valid.
# - An anyOf beside `required` alone (`type` object and annotations aside) adds the names to each
#   alternative's required ones, whatever else the alternative is (an object schema of the same `type`).
# - Without `type`, a oneOf of two or more alternatives merges too: every value that is no object is valid
#   for the base and every alternative, so for none of a oneOf; the merged schemas are objects.
# - `not_all_present(schema)`: a `not` of required names alone (`{"not": {"required": [a, b]}}`, or an allOf
#   of such parts: not every one of the names is present) beside object keywords: the objects of the schema
#   that miss one of the names, one object per name the schema does not itself require, each with that
#   name forbidden (an anyOf: an object missing two of them is valid for two). A value that is no object is
#   valid for `required`, so for no such `not`: the objects are typed.
# - `dependent_objects(schema)`: `dependentRequired` (or draft 7's `dependencies` of names only) beside object
#   keywords: for each name with names it depends on, either the name absent (forbidden) or it and those
#   names all required; one object per choice that can hold (`MAX_SPLITS` at most), an anyOf of them. A
#   value that is no object is valid for them: an object without `type` still takes it.
# Invariants: pure functions of JSON values; the base is never changed.
from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from constraintd.engine.schema.json_text import JsonValue, canonical, json_type
from constraintd.engine.schema.keywords import Enforcement, keyword_of

__all__ = ["MAX_SPLITS", "Merged", "dependent_objects", "merged_alternatives", "not_all_present"]

MAX_SPLITS: Final = 32  # objects one alternative of a oneOf may split into
_Schema = Mapping[str, JsonValue]
_ALTERNATIVE_KEYS: Final = frozenset({"required", "properties", "type"})
_BASE_REFUSED: Final = frozenset({"$ref", "allOf", "patternProperties", "unevaluatedProperties", "not",
                                  "if", "then", "else", "dependencies", "dependentRequired",
                                  "dependentSchemas", "propertyNames"})


@dataclass(frozen=True, slots=True)
class Merged:
    """One object of a merged alternative: its schema, the index of the alternative it came from, and the
    names it must not hold."""

    schema: dict[str, JsonValue]
    index: int
    forbidden: tuple[str, ...] = ()


def _annotations_only(schema: JsonValue) -> bool:
    return isinstance(schema, dict) and all(keyword_of(key).enforcement is Enforcement.ANNOTATION
                                            for key in schema)


def _values(schema: _Schema) -> list[JsonValue] | None:
    if "const" in schema:
        return [schema["const"]]
    listed = schema.get("enum")
    return list(listed) if isinstance(listed, list) and listed else None


def _meet(base: JsonValue, other: JsonValue) -> JsonValue | None:
    """The schema of the values valid for both, where it can be written exactly; else None."""
    if not (isinstance(base, dict) and isinstance(other, dict)):
        return None
    if _annotations_only(other) or canonical(base) == canonical(other):
        return base
    if _annotations_only(base):
        return other
    values = _values(other)
    if values is None or any(key not in ("const", "enum") and keyword_of(key).enforcement
                             is not Enforcement.ANNOTATION for key in other):
        return None
    rest = {key: value for key, value in base.items()
            if keyword_of(key).enforcement is not Enforcement.ANNOTATION}
    allowed = _values(base)
    if allowed is not None and set(rest) <= {"const", "enum", "type"}:
        texts = set(map(canonical, allowed))
        values = [value for value in values if canonical(value) in texts]
        rest.pop("const", None)
        rest.pop("enum", None)
    if set(rest) - {"type"}:
        return None
    declared = rest.get("type")
    if declared is not None:
        types = declared if isinstance(declared, list) else [declared]
        if not all(isinstance(t, str) for t in types):
            return None
        values = [value for value in values if json_type(value) in types
                  or (json_type(value) == "integer" and "number" in types)]
    return {"enum": values} if values else None


def _merge(base: _Schema, alternative: JsonValue) -> dict[str, JsonValue] | bool | None:
    """The merged schema; False where no object is valid for both; None where it cannot be written."""
    if not isinstance(alternative, dict):
        return None
    if any(key not in _ALTERNATIVE_KEYS and keyword_of(key).enforcement is not Enforcement.ANNOTATION
           for key in alternative):
        return None
    if alternative.get("type", "object") != "object":
        return None
    properties = base.get("properties", {})
    declared = alternative.get("properties", {})
    listed, more = base.get("required", []), alternative.get("required", [])
    if not (isinstance(properties, dict) and isinstance(declared, dict) and isinstance(listed, list)
            and isinstance(more, list)):
        return None
    extra = base.get("additionalProperties")
    merged_properties = dict(properties)
    for name, schema in declared.items():
        if name in properties:
            meet = _meet(properties[name], schema)
            if meet is None:
                return None
            merged_properties[name] = meet
        elif extra is None:  # other keys of any value: the alternative's schema holds
            merged_properties[name] = schema
        else:
            return None
    required = list(dict.fromkeys(name for name in [*listed, *more] if isinstance(name, str)))
    for name in required:
        if name not in merged_properties:
            if extra is False:
                return False
            merged_properties[name] = extra if isinstance(extra, dict) else {}
    if any(not isinstance(name, str) for name in [*listed, *more]):
        return None
    merged = dict(base)
    merged.update({"type": "object", "properties": merged_properties, "required": list(required)})
    return merged


def _tags(schema: _Schema) -> dict[str, set[str]]:
    # the required properties whose values are listed (const / enum), as canonical texts
    properties = schema.get("properties")
    required = schema.get("required")
    if not isinstance(properties, dict) or not isinstance(required, list):
        return {}
    tags: dict[str, set[str]] = {}
    for name in required:
        prop = properties.get(name) if isinstance(name, str) else None
        values = _values(prop) if isinstance(prop, dict) else None
        if values is not None and isinstance(name, str):
            tags[name] = set(map(canonical, values))
    return tags


def _disjoint(a: _Schema, b: _Schema) -> bool:
    tags_a, tags_b = _tags(a), _tags(b)
    return any(not tags_a[name] & tags_b[name] for name in tags_a.keys() & tags_b.keys())


def _required_only(base: _Schema, alternative: JsonValue) -> list[str] | None:
    """The names an alternative requires beyond the base, where they are its only constraint."""
    if not isinstance(alternative, dict):
        return None
    properties = base.get("properties", {})
    declared = alternative.get("properties", {})
    if not isinstance(declared, dict) or not isinstance(properties, dict):
        return None
    for name, schema in declared.items():
        if not (_annotations_only(schema) or (name in properties and _meet(properties[name], schema)
                                               == properties[name])):
            return None
    listed = base.get("required", [])
    more = alternative.get("required", [])
    if not isinstance(listed, list) or not isinstance(more, list):
        return None
    return [name for name in more if isinstance(name, str) and name not in listed]


def _required_into(schema: _Schema, key: str) -> list[Merged] | None:
    """An anyOf beside `required` alone (and `type` object, annotations): the names added to each
    alternative's required ones, whatever else the alternative says (an object schema, without `type` or
    of type object); None for any other form."""
    alternatives = schema.get(key)
    listed = schema.get("required")
    if key != "anyOf" or not isinstance(alternatives, list) or not isinstance(listed, list):
        return None
    if not all(isinstance(name, str) for name in listed):
        return None
    declared = schema.get("type")
    if declared not in (None, "object") or any(
            name not in ("required", "type", key)
            and keyword_of(name).enforcement is not Enforcement.ANNOTATION for name in schema):
        return None
    out = []
    for i, alternative in enumerate(alternatives):
        if not isinstance(alternative, dict) or alternative.get("type", declared) != declared or any(
                name in alternative for name in ("$ref", "oneOf", "anyOf", "allOf", "const", "enum")):
            return None
        more = alternative.get("required", [])
        if not isinstance(more, list):
            return None
        merged = {**alternative, "required": list(dict.fromkeys([*more, *listed]))}
        if declared is not None:
            merged["type"] = declared
        out.append(Merged(merged, i))
    return out or None


def merged_alternatives(schema: _Schema, key: str) -> list[Merged] | None:
    """The objects of `schema`'s oneOf / anyOf (`key`) merged with the keywords beside it (see the module
    comment), or None where the dialect does not merge them."""
    alternatives = schema.get(key)
    if not isinstance(alternatives, list) or not alternatives or ("oneOf" in schema and "anyOf" in schema):
        return None
    if any(name in schema for name in _BASE_REFUSED):
        return None
    required_only = _required_into(schema, key)
    if required_only is not None:
        return required_only
    declared = schema.get("type")
    untyped = (declared is None and key == "oneOf" and len(alternatives) >= 2 and "properties" in schema
               and not any(isinstance(alternative, dict) and "type" in alternative
                           for alternative in alternatives))
    if declared != "object" and not untyped:
        return None
    base = {name: value for name, value in schema.items() if name != key}
    merges = [_merge(base, alternative) for alternative in alternatives]
    if any(merge is None for merge in merges):
        return None
    out: list[Merged] = []
    for i, merge in enumerate(merges):
        if not isinstance(merge, dict):
            continue  # no object is valid for the base and this alternative
        if key == "anyOf":
            out.append(Merged(merge, i))
            continue
        choices: list[Sequence[str]] = []
        for j, other in enumerate(merges):
            if j == i or other is False or (isinstance(other, dict) and _disjoint(merge, other)):
                continue
            names = _required_only(base, alternatives[j])
            if names is None:
                return None
            # alternative i's objects must miss one of them; one it requires cannot be missed
            required = merge.get("required")
            assert isinstance(required, list)
            choices.append([name for name in names if name not in required])
        splits = [tuple(dict.fromkeys(combination)) for combination in itertools.product(*choices)]
        if len(splits) > MAX_SPLITS:
            return None
        out.extend(Merged(merge, i, forbidden) for forbidden in dict.fromkeys(splits))
    return out or None


# keywords beside such a `not` whose objects the forbidden names do not change, or that the builder reads as
# objects of their own (the object keywords; `type` object; annotations)
_BESIDE_NOT: Final = frozenset({"type", "properties", "required", "additionalProperties", "minProperties",
                                "maxProperties", "not"})


def _required_names(schema: JsonValue) -> list[str] | None:
    """The names `schema` requires, where requiring them (in allOf parts too) is all it says, annotations
    aside; else None."""
    if not isinstance(schema, dict):
        return None
    names: list[str] = []
    for key, value in schema.items():
        if key == "required" and isinstance(value, list) and all(isinstance(name, str) for name in value):
            names.extend(name for name in value if isinstance(name, str))
        elif key == "allOf" and isinstance(value, list) and value:
            for part in value:
                more = _required_names(part)
                if more is None:
                    return None
                names.extend(more)
        elif keyword_of(key).enforcement is not Enforcement.ANNOTATION:
            return None
    return list(dict.fromkeys(names))


def not_all_present(schema: _Schema) -> list[Merged] | None:
    """The objects of `schema` without its `not` of required names, one per name it may miss (see the
    module comment), or None where the schema is of another form."""
    if any(key not in _BESIDE_NOT and keyword_of(key).enforcement is not Enforcement.ANNOTATION
           for key in schema) or schema.get("type", "object") != "object":
        return None
    names = _required_names(schema["not"])
    listed = schema.get("required", [])
    if not names or not isinstance(listed, list):
        return None  # `not` of nothing required: no value is valid; left to the default reading
    base = {key: value for key, value in schema.items() if key != "not"}
    base["type"] = "object"
    return [Merged(base, i, (name,)) for i, name in enumerate(names) if name not in listed] or None


_BESIDE_DEPENDENCIES: Final = frozenset({"type", "properties", "required", "additionalProperties",
                                         "minProperties", "maxProperties", "dependencies",
                                         "dependentRequired"})


def dependent_objects(schema: _Schema) -> list[Merged] | None:
    """The objects of `schema` without its dependent requirements, one per choice of each dependent name
    absent or present with its names (see the module comment), or None where the schema is of another
    form."""
    if any(key not in _BESIDE_DEPENDENCIES and keyword_of(key).enforcement is not Enforcement.ANNOTATION
           for key in schema) or schema.get("type", "object") != "object":
        return None
    entries: list[tuple[str, list[str]]] = []
    for key in ("dependencies", "dependentRequired"):
        table = schema.get(key, {})
        if not isinstance(table, dict):
            return None
        for name, names in table.items():
            if not isinstance(names, list) or not all(isinstance(other, str) for other in names):
                return None  # a dependent schema
            entries.append((name, [other for other in names if isinstance(other, str)]))
    listed = schema.get("required", [])
    declared = schema.get("properties", {})
    if not entries or not isinstance(listed, list) or not isinstance(declared, dict):
        return None
    closed = schema.get("additionalProperties") is False
    base = {key: value for key, value in schema.items() if key not in ("dependencies", "dependentRequired")}
    out: list[Merged] = []
    for choice in itertools.product((False, True), repeat=len(entries)):
        required = list(dict.fromkeys(name for name in listed if isinstance(name, str)))
        forbidden: list[str] = []
        for present, (dependent, needed) in zip(choice, entries, strict=True):
            if present:
                required.extend(other for other in [dependent, *needed] if other not in required)
            else:
                forbidden.append(dependent)
        if set(required) & set(forbidden) or (closed and any(other not in declared for other in required)):
            continue  # no object holds this choice
        if len(out) == MAX_SPLITS:
            return None
        out.append(Merged({**base, "required": list[JsonValue](required)}, len(out),
                          tuple(dict.fromkeys(forbidden))))
    return out or None
