"""The extended dialect's allOf (constraintd/engine/schema/all_of.py): the parts merged into one schema
where the merge is exact. Each merge is judged by `jsonschema` (2020-12): the merged schema and the original
agree on a grid of values; and the grammar of the original, where strict compiles it, takes exactly the
documents `jsonschema` calls valid."""

from __future__ import annotations

import itertools
import json
from typing import Any

import jsonschema
import pytest

from constraintd.engine.schema.all_of import merged_all_of
from constraintd.engine.schema.convert import convert_json_schema
from tests.engine.schema.test_extended import grammar_of, takes, valid

MERGED: list[dict[str, Any]] = [
    # objects: properties of the same name meet, other keys as each part says
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
               {"properties": {"a": {"minimum": 2}, "b": {"type": "string"}},
                "additionalProperties": False}]},
    {"type": "object", "properties": {"a": {"type": "string"}},
     "allOf": [{"properties": {"b": {"type": "boolean"}}, "required": ["b"]},
               {"additionalProperties": {"type": ["string", "boolean"]}}]},
    # types, bounds, lengths, counts
    {"allOf": [{"type": ["integer", "string"]}, {"type": "number", "minimum": 0}, {"maximum": 5},
               {"minimum": 1}]},
    {"allOf": [{"type": "string", "minLength": 1}, {"maxLength": 3}, {"minLength": 2}]},
    {"allOf": [{"type": "array", "items": {"type": "integer"}}, {"items": {"minimum": 0}, "maxItems": 2}]},
    {"allOf": [{"multipleOf": 2}, {"multipleOf": 3}, {"type": "integer"}]},
    # listed values: those the other parts allow
    {"allOf": [{"enum": [{"bar": 2, "foo": "baz"}, {"bar": 2}]},
               {"not": {"not": {"allOf": [
                   {"properties": {"bar": {"type": "integer"}}, "required": ["bar"]},
                   {"properties": {"foo": {"type": "string"}}, "required": ["foo"]}]}}}]},
    {"allOf": [{"enum": ["foo", 1, {}]}, {"not": {"type": "object"}}]},
    {"allOf": [{"$ref": "#/$defs/small"}, {"const": 3}], "$defs": {"small": {"maximum": 4}}},
    # nested allOf, $ref parts
    {"allOf": [{"allOf": [{"type": "integer"}, {"minimum": 1}]}, {"$ref": "#/$defs/top"}],
     "$defs": {"top": {"maximum": 3}}},
]
NAMES = ["a", "b", "bar", "foo"]
NOT_MERGED: list[dict[str, Any]] = [
    {"allOf": [{"pattern": "^a"}, {"pattern": "b$"}]},  # two patterns: no one pattern said here
    {"allOf": [{"anyOf": [{"type": "integer"}]}, {"anyOf": [{"minimum": 1}]}]},
    {"allOf": [{"patternProperties": {"^a": {}}}, {"properties": {"b": {}}}]},
    {"allOf": [{"properties": {"a": {}}}, {"unevaluatedProperties": False}]},
    {"allOf": [{"minimum": 1, "exclusiveMinimum": True}, {"minimum": 0}]},  # draft 4's flag is its part's
    {"allOf": [{"type": "string"}, {"type": "integer"}]},  # nothing valid: left to the default reading
    {"allOf": [{"enum": [1, 2]}, {"pattern": "^1"}]},  # a value against a keyword not read
    {"allOf": [{"$ref": "#/$defs/a", "minimum": 1}], "$defs": {"a": {}}},  # $ref's siblings differ by draft
    {"allOf": [{"contains": {"const": 1}}, {"contains": {"const": 2}}]},
]
LEAVES: list[Any] = [None, True, False, -1, 0, 1, 2, 3, 4, 5, 6, 7, 0.5, 2.0, 6.5, "", "a", "ab", "abc",
                     "abcd", "foo", "baz"]
SMALL: list[Any] = [None, True, -1, 0, 2, 3, 0.5, "a", "foo", "baz"]
# every leaf; arrays of up to two small values; objects of up to two of the names, of small values and {}
VALUES: list[Any] = [
    *LEAVES, [], {},
    *([x] for x in SMALL), *([x, y] for x in SMALL for y in SMALL),
    *({k: x} for k in NAMES for x in [*SMALL, {}]),
    *({k: x, m: y} for k, m in itertools.combinations(NAMES, 2) for x in SMALL for y in SMALL),
]


@pytest.mark.parametrize("schema", MERGED, ids=range(len(MERGED)))
def test_a_merge_validates_what_the_schema_validates(schema: dict[str, Any]) -> None:
    merged = merged_all_of(schema, schema)
    assert merged is not None and "allOf" not in merged
    merged_root = {**merged, **{key: schema[key] for key in ("$defs",) if key in schema}}
    for value in VALUES:
        assert valid(merged_root, value) == valid(schema, value), (merged, value)


@pytest.mark.parametrize("schema", NOT_MERGED, ids=["patterns", "two-anyOfs", "patternProperties",
                                                     "unevaluated", "draft4-flag", "no-value", "enum-pattern",
                                                     "ref-siblings", "two-contains"])
def test_what_does_not_merge_exactly_is_left(schema: dict[str, Any]) -> None:
    assert merged_all_of(schema, schema) is None


@pytest.mark.parametrize("schema", MERGED, ids=range(len(MERGED)))
def test_the_grammar_takes_exactly_the_valid_documents(schema: dict[str, Any]) -> None:
    # where the report names keywords the grammar leaves (strict refuses such a schema), the grammar may take
    # more than the valid documents, never less
    exact = not convert_json_schema(json.dumps(schema), dialect="extended").unenforced
    grammar = grammar_of(schema, strict=exact)
    for value in VALUES:
        if isinstance(value, float) and value.is_integer():
            continue  # 2.0 spells an integer the grammar takes as 2 only (as the default dialect)
        text = json.dumps(value, separators=(",", ":"))
        if exact or valid(schema, value):
            assert takes(grammar, text) == valid(schema, value), (schema, text)


def test_the_corpus_forms_compile_under_strict() -> None:
    # the shapes of the MaskBench refusals this reading takes: an enum beside a `not` (JSON Schema Test
    # Suite's allOf/not cases, as MaskBench's Synthesized files carry them), objects across parts
    for schema in (MERGED[0], MERGED[1], MERGED[6], MERGED[7], MERGED[9]):
        assert convert_json_schema(json.dumps(schema), dialect="extended").unenforced == (), schema
    assert jsonschema.Draft202012Validator(MERGED[6]).is_valid({"bar": 2, "foo": "baz"})
