"""One value against a schema (constraintd/engine/schema/value_checks.py): where it gives a verdict, the
verdict is `jsonschema`'s (2020-12, draft 7 for its own keywords), on schemas of the keywords it reads and a
grid of values; where a keyword is not read, no verdict."""

from __future__ import annotations

import itertools
from typing import Any

import jsonschema
import pytest

from constraintd.engine.schema.value_checks import validates

SCHEMAS: list[dict[str, Any]] = [
    {"type": "integer", "minimum": 2, "exclusiveMaximum": 9, "multipleOf": 3},
    {"type": ["number", "string"], "maximum": 1.5, "minLength": 2, "maxLength": 3},
    {"multipleOf": 0.5},
    {"not": {"type": "object"}},
    {"not": {"not": {"allOf": [{"properties": {"bar": {"type": "integer"}}, "required": ["bar"]},
                               {"properties": {"foo": {"type": "string"}}, "required": ["foo"]}]}}},
    {"anyOf": [{"const": 1}, {"type": "boolean"}], "oneOf": [{"enum": [1, True]}, {"const": False}]},
    {"oneOf": [{"type": "integer"}, {"minimum": 2}]},
    {"properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "integer"}, "required": ["a"]},
    {"minProperties": 1, "maxProperties": 2, "propertyNames": {"maxLength": 1}},
    {"dependentRequired": {"a": ["b"]}, "dependentSchemas": {"b": {"required": ["c"]}}},
    {"if": {"type": "integer"}, "then": {"minimum": 0}, "else": {"type": "string"}},
    {"prefixItems": [{"type": "integer"}], "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
    {"uniqueItems": True, "contains": {"type": "integer"}, "minContains": 2, "maxContains": 3},
    {"$ref": "#/$defs/n", "$defs": {"n": {"type": "null"}}},
    {"enum": [[1, 2], {"a": 1}, 1.0, "x"]},
]
DRAFT7: list[dict[str, Any]] = [
    {"items": [{"type": "integer"}], "additionalItems": {"type": "boolean"}},
    {"dependencies": {"a": ["b"], "b": {"required": ["c"]}}},
    {"minimum": 1, "exclusiveMinimum": True, "maximum": 3, "exclusiveMaximum": False},
]
LEAVES: list[Any] = [None, True, False, -3, -1, 0, 1, 2, 3, 6, 9, 12, 0.5, 1.5, 3.0, 0.3, -1.0, "", "x", "ab",
                     "abc", "abcd"]
SMALL: list[Any] = [None, True, 0, 1, 2, 1.5, "x", "ab"]
NAMES = ["a", "b", "c", "bar", "foo", "long"]
# every leaf; arrays of up to three small values; objects of up to two of the names, of small values
VALUES: list[Any] = [
    *LEAVES, [], {}, [[1, 2]], [{"a": 1}], {"a": 1.0},
    *([x] for x in SMALL), *([x, y] for x in SMALL for y in SMALL),
    *([x, y, z] for x in SMALL[:4] for y in SMALL[:4] for z in SMALL[:4]),
    *({k: x} for k in NAMES for x in SMALL),
    *({k: x, m: y} for k, m in itertools.combinations(NAMES, 2) for x in SMALL for y in SMALL[:5]),
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_a_verdict_is_jsonschemas(schema: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    for value in VALUES:
        verdict = validates(schema, value)
        assert verdict is not None
        assert verdict == validator.is_valid(value), (schema, value)


@pytest.mark.parametrize("schema", DRAFT7, ids=range(len(DRAFT7)))
def test_draft_7s_keywords_are_read_as_draft_7_has_them(schema: dict[str, Any]) -> None:
    # draft 4 for its boolean exclusives
    draft = jsonschema.Draft4Validator if "exclusiveMinimum" in schema else jsonschema.Draft7Validator
    validator = draft(schema)
    for value in VALUES:
        assert validates(schema, value) == validator.is_valid(value), (schema, value)


@pytest.mark.parametrize(
    "schema",
    [{"pattern": "^a"}, {"format": "email"}, {"patternProperties": {"a": {}}}, {"$ref": "http://x/y"},
     {"unevaluatedProperties": False}, {"not": {"pattern": "a"}},
     {"anyOf": [{"const": 1}, {"format": "ipv4"}]},
     {"$ref": "#/$defs/loop", "$defs": {"loop": {"$ref": "#/$defs/loop"}}}],
    ids=["pattern", "format", "patternProperties", "remote-ref", "unevaluated", "inside-not", "inside-anyOf",
         "ref-loop"],
)
def test_a_keyword_not_read_gives_no_verdict(schema: dict[str, Any]) -> None:
    assert validates(schema, "a") is None


def test_a_fraction_s_multiple_is_told_only_where_validators_agree() -> None:
    # 0.3 is three tenths as written, but 0.3 / 0.1 is 2.9999999999999996 in doubles (jsonschema's reading)
    assert validates({"multipleOf": 0.1}, 0.3) is None
    assert validates({"multipleOf": 0.1}, 0.25) is False
    assert validates({"multipleOf": 0.5}, 1.5) is True
    assert validates({"multipleOf": 3}, 9) is True and validates({"multipleOf": 3}, 10) is False


def test_annotations_and_unknown_keywords_are_skipped() -> None:
    assert validates({"title": "t", "x-custom": 3, "description": "d", "type": "string"}, "a") is True
    assert validates({"title": "t", "type": "string"}, 1) is False
