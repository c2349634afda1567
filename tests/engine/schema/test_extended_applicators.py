"""The extended dialect's reading of types and applicators (constraintd/engine/schema/extended.py): an
object without `type`, `type` beside oneOf/anyOf and `$ref`, and what strict refuses. Each document is
judged by `jsonschema` (2020-12) and by the grammar, on its bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from constraintd.engine.schema.convert import convert_json_schema
from constraintd.errors import SchemaError
from tests.engine.schema.test_extended import grammar_of, takes, valid

OBJECT_WITHOUT_TYPE: dict[str, Any] = {"properties": {"a": {"type": "integer"}}, "required": ["a"],
                                       "additionalProperties": False}
DOCUMENTS = ['{"a":1}', '{"a":"x"}', '{}', '{"a":1,"b":2}', '"text"', "12", "1.5", "true", "null", "[1,{}]",
             '[{"a":"x"}]']


def check(schema: dict[str, Any], documents: list[str]) -> None:
    grammar = grammar_of(schema)
    for text in documents:
        assert takes(grammar, text) == valid(schema, json.loads(text)), text


def test_an_object_without_type_takes_every_other_value() -> None:
    check(OBJECT_WITHOUT_TYPE, DOCUMENTS)
    check({"properties": {"files": {"type": "array"}}}, [*DOCUMENTS, '{"files":[]}', '{"files":{}}'])


def test_an_object_without_type_beside_other_kinds_keywords_is_reported() -> None:
    # minLength speaks of the strings it now takes
    schema = {**OBJECT_WITHOUT_TYPE, "minLength": 3}
    with pytest.raises(SchemaError, match="minLength"):
        convert_json_schema(json.dumps(schema), strict=True, dialect="extended")


def test_an_object_without_type_stays_llama_cpps_by_default() -> None:
    conversion = convert_json_schema(json.dumps(OBJECT_WITHOUT_TYPE))
    assert "string" not in conversion.grammar


def test_type_object_beside_alternatives_without_type() -> None:
    schema = {"type": "object", "anyOf": [OBJECT_WITHOUT_TYPE,
                                          {"properties": {"b": {"type": "string"}}, "required": ["b"]}]}
    check(schema, [*DOCUMENTS, '{"b":"x"}', '{"b":1}', '{"b":"x","a":1}'])


def test_a_one_of_of_objects_without_type_takes_no_other_value() -> None:
    # a string is valid for both alternatives, so for the oneOf it is not
    schema = {"oneOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"properties": {"b": {"type": "integer"}}, "additionalProperties": False}]}
    check(schema, [*DOCUMENTS, '{"b":1}', '{"b":"x"}'])


def test_type_object_beside_a_ref_to_an_object_without_type() -> None:
    schema = {"$defs": {"o": OBJECT_WITHOUT_TYPE}, "type": "object",
              "properties": {"x": {"type": "object", "$ref": "#/$defs/o"}}, "required": ["x"]}
    check(schema, ['{"x":{"a":1}}', '{"x":"text"}', '{"x":1}', '{"x":{}}'])
    one = {"$defs": {"o": OBJECT_WITHOUT_TYPE}, "type": "object", "anyOf": [{"$ref": "#/$defs/o"}]}
    check(one, DOCUMENTS)
