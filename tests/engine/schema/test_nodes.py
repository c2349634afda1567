"""The schema tree llama.cpp's converter walks: keyword precedence, narrowing of numbers, refusals, limits."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from constraintd.engine.schema.json_text import parse_json
from constraintd.engine.schema.nodes import (
    INT64_MAX,
    INT64_MIN,
    AllOfNode,
    AnyNode,
    AnyOfNode,
    ArrayNode,
    ConstNode,
    EnumNode,
    IntegerNode,
    NullNode,
    ObjectNode,
    Property,
    RefNode,
    SchemaDocument,
    SchemaNode,
    StringFormat,
    StringNode,
    TupleNode,
    WorkLimit,
    schema_from_json,
)
from constraintd.errors import SchemaError
from tests.conftest import OracleReport
from tests.schema_oracle.build import harness_binary
from tests.schema_oracle.compare import compare_conversion

FAILED = "JSON schema conversion failed:\nJSON schema error at "


@pytest.fixture(scope="session")
def schema_oracle(llama_cpp_dir: Path) -> Path:
    return harness_binary(llama_cpp_dir)


def build(text: str, *, max_depth: int = 100, seconds: float = 10.0) -> SchemaDocument:
    limit = WorkLimit(max_depth=max_depth, deadline=time.monotonic() + seconds)
    return schema_from_json(parse_json(text), limit)


def root(text: str) -> SchemaNode:
    return build(text).root


@pytest.mark.parametrize(
    ("text", "node"),
    [
        ('{"$ref": "#/$defs/a", "anyOf": [{}], "$defs": {"a": {}}}', RefNode("#", "#/$defs/a")),
        ('{"oneOf": [{}], "anyOf": [{"type": "null"}]}', AnyOfNode("#", (AnyNode("#/oneOf/0"),))),
        ('{"type": ["null", "string"], "const": 1}', AnyOfNode("#", (ConstNode("#", 1), ConstNode("#", 1)))),
        ('{"const": null, "enum": [1]}', ConstNode("#", None)),
        ('{"enum": [1, "a"], "type": "kaboom"}', EnumNode("#", (1, "a"))),
        ('{"type": ["null", "string"]}', AnyOfNode("#", (NullNode("#"), StringNode("#")))),
        ('{"type": null, "minLength": 2}', StringNode("#", min_length=2)),
        ('{"minimum": 3}', AnyNode("#")),
        ('{"format": "uuid3"}', StringNode("#", format=StringFormat.UUID)),
        ('{"format": "uuid7"}', AnyNode("#")),
        ('{"items": [{}], "minItems": "x"}', TupleNode("#", (AnyNode("#/items/0"),))),
        ('{"items": {}, "prefixItems": [{}]}', ArrayNode("#", AnyNode("#/items"))),
        ('{"type": "array", "maxItems": 4294967296}', ArrayNode("#", AnyNode("#"), max_items=0)),
        ('{"type": "object"}', ObjectNode("#", (), AnyNode("#"))),
        ('{"additionalProperties": true}', AnyNode("#")),
        ('{"properties": {"a": {}}, "required": ["a", 3]}',
         ObjectNode("#", (Property("a", AnyNode("#/properties/a"), True),), None)),
        ('{"type": "object", "allOf": [{}]}', AllOfNode("#", (AnyNode("#/allOf/0"),))),
        ('{"type": "object", "allOf": [{}], "properties": {}}', ObjectNode("#", (), None)),
        ('{"type": "string", "allOf": [{}], "pattern": "^a$"}', AllOfNode("#", (AnyNode("#/allOf/0"),))),
    ],
    ids=["ref-first", "oneOf-over-anyOf", "type-list-copies-the-rest", "const-over-enum", "enum-over-type",
         "type-list", "no-type-string", "no-type-any", "uuid-versions", "no-uuid7", "tuple-ignores-counts",
         "items-win", "count-wraps", "bare-object", "additional-true-only", "required", "object-allOf",
         "properties-win-over-allOf", "string-allOf"],
)
def test_node_built(text: str, node: SchemaNode) -> None:
    assert root(text) == node


@pytest.mark.parametrize(
    ("bounds", "minimum", "maximum"),
    [
        ('"minimum": 2.5, "maximum": 7.5', 3, 7),
        ('"exclusiveMinimum": 2.5, "exclusiveMaximum": 7.5', 3, 7),
        ('"exclusiveMinimum": 2, "exclusiveMaximum": 7', 3, 6),
        ('"minimum": 1, "exclusiveMinimum": 5', 1, INT64_MAX),
        ('"maximum": 1e300', INT64_MIN, INT64_MIN),
        ('"minimum": 18446744073709551615', -1, INT64_MAX),
        ('"exclusiveMaximum": -9223372036854775808', INT64_MIN, INT64_MAX),
    ],
    ids=["rounded-inwards", "exclusive-fractions", "exclusive", "inclusive-wins", "double-out-of-range",
         "unsigned-wraps", "decrement-wraps"],
)
def test_integer_bounds_are_narrowed_as_cpp_narrows(bounds: str, minimum: int, maximum: int) -> None:
    assert root(f'{{"type": "integer", {bounds}}}') == IntegerNode("#", minimum, maximum)


def test_ref_targets_are_built_once_and_cycles_are_names() -> None:
    document = build('{"$ref": "#/$defs/n", "$defs": {"n": {"items": {"$ref": "#/$defs/n"}}}}')
    assert document.root == RefNode("#", "#/$defs/n")
    assert document.refs == {"#/$defs/n": ArrayNode("#/$defs/n", RefNode("#/$defs/n/items", "#/$defs/n"))}


ARRAY_STEPS = {  # name: ($ref into the array "defs", whether it resolves)
    "index": ("#/defs/0", True), "minus-zero": ("#/defs/-0", True), "leading-space": ("#/defs/ 0", True),
    "trailing-junk": ("#/defs/0x", True), "past-end": ("#/defs/1", False), "negative": ("#/defs/-1", False),
    "word": ("#/defs/x", False), "empty": ("#/defs/", False),
    "too-big": ("#/defs/99999999999999999999", False),
}


def array_step_schema(ref: str) -> str:
    return f'{{"defs": [{{"type": "null"}}], "items": {{"$ref": "{ref}"}}}}'


@pytest.mark.parametrize(("ref", "resolves"), ARRAY_STEPS.values(), ids=ARRAY_STEPS.keys())
def test_array_steps_of_a_ref_read_indexes_as_stoull(ref: str, resolves: bool) -> None:
    if resolves:
        assert build(array_step_schema(ref)).refs[ref] == NullNode(ref)
    else:
        with pytest.raises(SchemaError, match="is out of range"):
            build(array_step_schema(ref))


@pytest.mark.oracle
@pytest.mark.parametrize(("ref", "resolves"), ARRAY_STEPS.values(), ids=ARRAY_STEPS.keys())
def test_array_steps_of_a_ref_are_llamas(
    ref: str, resolves: bool, schema_oracle: Path, oracle_report: OracleReport
) -> None:
    verdict = compare_conversion(schema_oracle, array_step_schema(ref))
    oracle_report.add("schema grammars", "schema-tree cases", identical=int(verdict.verdict == "identical"),
                      total=1)
    assert verdict.verdict == "identical", verdict.detail


REFUSALS = {  # name: (schema, message after "JSON schema error at ", pointer)
    "not an object": ('{"items": true}', "#/items: schema must be an object", "#/items"),
    "ref not a string": ('{"$ref": 1}', "#: $ref must be a string", "#"),
    "remote ref": (
        '{"$ref": "a.json#/x"}',
        "#: unsupported $ref a.json#/x, only references into the same document are supported", "#"),
    "ref key missing": (
        '{"$ref": "#/nothing/here"}', "#: cannot resolve $ref #/nothing/here, nothing not found", "#"),
    "empty anyOf": ('{"anyOf": []}', "#/anyOf: must not be empty", "#/anyOf"),
    "anyOf not a list": ('{"oneOf": {}}', "#/oneOf: must be an array of schemas", "#/oneOf"),
    "empty type list": ('{"type": []}', "#: type must not be empty", "#"),
    "bad entry of a type list": (
        '{"type": ["null", 3]}', "#/type/1: type must be a string or an array of strings", "#"),
    "empty enum": ('{"enum": []}', "#: enum must be a non-empty array", "#"),
    "properties not an object": ('{"properties": []}', "#: properties must be an object", "#"),
    "additional not a schema": (
        '{"additionalProperties": 1}', "#: additionalProperties must be a boolean or a schema", "#"),
    "float count": (
        '{"type": "string", "maxLength": 2.0}', "#: maxLength must be a non-negative integer", "#"),
    "count past INT_MAX": (
        '{"items": {}, "minItems": 2147483648}', "#: minItems must be a non-negative integer", "#"),
    "format not a string": ('{"format": 1}', "#: format must be a string", "#"),
    "pattern not a string": ('{"type": "string", "pattern": null}', "#: pattern must be a string", "#"),
    "bound not a number": ('{"type": "integer", "minimum": "1"}', "#: minimum must be a number", "#"),
    "unknown type": (
        '{"properties": {"a/b": {"type": "int"}}}', "#/properties/a/b: unrecognized type int",
        "#/properties/a~1b"),
}


@pytest.mark.parametrize(("text", "message", "pointer"), REFUSALS.values(), ids=REFUSALS.keys())
def test_refusal_message_and_pointer(text: str, message: str, pointer: str) -> None:
    with pytest.raises(SchemaError) as caught:
        build(text)
    assert caught.value.reason == FAILED + message
    assert caught.value.pointer == pointer


@pytest.mark.oracle
@pytest.mark.parametrize(("text", "message", "pointer"), REFUSALS.values(), ids=REFUSALS.keys())
def test_refusal_is_llamas(
    text: str, message: str, pointer: str, schema_oracle: Path, oracle_report: OracleReport
) -> None:
    verdict = compare_conversion(schema_oracle, text)
    oracle_report.add("schema refusals", "schema-tree cases", identical=int(verdict.verdict == "identical"),
                      total=1)
    assert verdict.verdict == "identical", verdict.detail


def test_work_limit_counts_depth_through_refs() -> None:
    defs = '"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/c"}, "c": {}'
    chain = f'{{"$ref": "#/$defs/a", "$defs": {{{defs}}}}}'
    assert build(chain, max_depth=4).root == RefNode("#", "#/$defs/a")
    with pytest.raises(SchemaError, match="deeper than 3 levels") as caught:
        build(chain, max_depth=3)
    assert caught.value.pointer == "#/$defs/c"


def test_work_limit_deadline() -> None:
    with pytest.raises(SchemaError, match="time limit"):
        build('{"type": "null"}', seconds=-1.0)
