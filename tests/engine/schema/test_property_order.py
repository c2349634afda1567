"""The extended dialect's objects (constraintd/engine/schema/property_order.py): properties in any order,
checked on raw bytes against a validator of JSON Schema 2020-12 (`jsonschema`)."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any, Final

import pytest

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.schema.convert import convert_json_schema, json_schema_to_gbnf
from constraintd.engine.schema.property_order import ANY_ORDER_MAX, REQUIRED_MAX, in_any_order
from constraintd.errors import SchemaError

jsonschema = pytest.importorskip("jsonschema")

BYTES: Final = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])
VALUES: Final = {"integer": 1, "string": "x", "boolean": True}


def grammar_of(schema: dict[str, Any], *, strict: bool = True) -> Grammar:
    gbnf = json_schema_to_gbnf(json.dumps(schema), strict=strict, dialect="extended")
    return Grammar.from_gbnf(gbnf, BYTES)


def takes(grammar: Grammar, text: str) -> bool:
    matcher = Matcher(grammar)
    return matcher.accept_bytes(text.encode()) and matcher.is_complete()


def valid(schema: dict[str, Any], document: object) -> bool:
    return bool(jsonschema.Draft202012Validator(schema).is_valid(document))


def object_schema(count: int, required: int, **more: Any) -> dict[str, Any]:
    kinds = list(VALUES)
    properties = {f"p{i}": {"type": kinds[i % len(kinds)]} for i in range(count)}
    names = [f"p{i}" for i in range(required)]
    return {"type": "object", "properties": properties, "required": names, **more}


def pairs_text(pairs: list[tuple[str, object]]) -> str:
    # written by hand: a dict cannot hold a repeated key
    return "{" + ",".join(f"{json.dumps(key)}:{json.dumps(value)}" for key, value in pairs) + "}"


def value_of(schema: dict[str, Any], key: str) -> object:
    declared = schema["properties"].get(key)
    return VALUES[declared["type"]] if declared else [key]


def assert_every_order_decided_as_valid(schema: dict[str, Any], grammar: Grammar) -> None:
    """Every order of every subset of the declared properties and one other key: taken exactly when valid."""
    keys = [*schema["properties"], "other"]
    for size in range(len(keys) + 1):
        for chosen in itertools.permutations(keys, size):
            document = {key: value_of(schema, key) for key in chosen}
            assert takes(grammar, pairs_text(list(document.items()))) == valid(schema, document), chosen


@pytest.mark.parametrize("additional", [False, None], ids=["closed", "open"])
def test_every_order_of_every_subset_is_taken_exactly_when_valid(additional: bool | None) -> None:
    more = {} if additional is None else {"additionalProperties": additional}
    schema = object_schema(4, 2, **more)
    grammar = grammar_of(schema)
    assert_every_order_decided_as_valid(schema, grammar)


def test_a_repeated_property_is_refused_up_to_the_exact_bound() -> None:
    schema = object_schema(3, 1, additionalProperties=False)
    grammar = grammar_of(schema)
    assert takes(grammar, '{"p1":"x","p0":1}')
    assert not takes(grammar, '{"p0":1,"p0":1}')
    assert not takes(grammar, '{"p1":"x","p0":1,"p1":"x"}')


@pytest.mark.parametrize(("count", "required"), [(4, 3), (4, 4), (5, 5)])
def test_past_the_bound_all_required_or_three_of_four_stay_exact(count: int, required: int) -> None:
    # the exact grammar is the smaller there: every order of every subset, and no property twice
    schema = object_schema(count, required)
    grammar = grammar_of(schema)
    assert_every_order_decided_as_valid(schema, grammar)
    pairs = [(key, value_of(schema, key)) for key in schema["properties"]]
    assert takes(grammar, pairs_text(pairs))
    assert not takes(grammar, pairs_text([*pairs, pairs[0]]))
    assert not takes(grammar, pairs_text([pairs[-1], *pairs]))


def test_five_properties_one_optional_a_property_may_repeat() -> None:
    # five properties, four required: tracking the required ones is the smaller grammar
    schema = object_schema(5, 4)
    grammar = grammar_of(schema)
    pairs = [(key, value_of(schema, key)) for key in schema["properties"]]
    assert takes(grammar, pairs_text([*pairs, pairs[0]]))
    assert not takes(grammar, pairs_text(pairs[1:]))


def test_a_wrong_value_is_refused_in_any_place() -> None:
    schema = object_schema(3, 1)
    grammar = grammar_of(schema)
    assert takes(grammar, '{"p2":true,"q":[],"p0":1}')
    assert not takes(grammar, '{"p2":true,"q":[],"p0":"x"}')
    assert not takes(grammar, '{"p2":1,"p0":1}')


@pytest.mark.parametrize("count", [1, 4], ids=["any-order", "required-tracked"])
def test_loops_of_two_objects_whose_rule_names_collide_keep_their_own_pairs(count: int) -> None:
    # "a-b" and "a"'s "b" both name their rules a-b-...: the loops of other pairs (x-others, x-sep, x-loop),
    # which refer to themselves, must each refer to its own rule, not the other object's
    def inner(name: str) -> dict[str, Any]:
        return {"type": "object", "properties": {f"{name}{i}": {"type": "integer"} for i in range(count)},
                "required": [f"{name}0"]}

    schema = {"type": "object", "properties": {"a-b": inner("p"), "a": {"type": "object",
                                                                      "properties": {"b": inner("q")}}}}
    gbnf = json_schema_to_gbnf(json.dumps(schema), strict=True, dialect="extended")
    assert "a-b-x-others0 ::=" in gbnf or "a-b-x-loop-00 ::=" in gbnf  # the names did collide
    grammar = Grammar.from_gbnf(gbnf, BYTES)
    # other pairs after the required one: each loop's second pair and on comes from its own rule
    documents: list[Any] = [
        {"a-b": {"p0": 1, "z": 1, "w": 2, "q0": "x", "q1": "x"}},
        {"a-b": {"p0": 1, "z": 1, "p1": "x"}},
        {"a-b": {"p0": 1, "z": 1, "w": 2, "p2": None}},
        {"a": {"b": {"q0": 2, "z": 1, "w": 3, "p0": "x", "p1": [4]}}},
        {"a": {"b": {"q0": 2, "z": 1, "q1": "x"}}},
        {"a": {"b": {"q0": 2, "z": 1, "w": 3, "q2": None}}},
    ]
    for document in documents:
        assert takes(grammar, json.dumps(document)) == valid(schema, document), document


@pytest.mark.parametrize(("count", "required"), [(12, 2), (20, 4)])
def test_past_the_exact_bound_few_required_properties_are_tracked(count: int, required: int) -> None:
    schema = object_schema(count, required, additionalProperties=False)
    assert convert_json_schema(json.dumps(schema), dialect="extended").unenforced == ()
    grammar = grammar_of(schema)
    rng = random.Random(count)
    keys = list(schema["properties"])
    for _ in range(200):
        chosen = rng.sample(keys, rng.randint(0, count))
        document = {key: value_of(schema, key) for key in chosen}
        assert takes(grammar, pairs_text(list(document.items()))) == valid(schema, document), chosen
    # a repeated key whose values are each valid: valid whichever value a reader keeps
    pairs = [(key, value_of(schema, key)) for key in keys[:required]]
    last = keys[count - 1]
    assert takes(grammar, pairs_text([*pairs, (last, value_of(schema, last)), pairs[1]]))
    assert not takes(grammar, pairs_text([*pairs, ("p1", 1)]))  # a repeated key, a wrong value


def test_too_many_required_properties_keep_the_schemas_order_and_are_reported() -> None:
    schema = object_schema(REQUIRED_MAX + 4, REQUIRED_MAX + 2)
    conversion = convert_json_schema(json.dumps(schema), dialect="extended")
    found = [(item.pointer, item.keyword) for item in conversion.unenforced]
    assert found == [("#/properties", "properties")]
    with pytest.raises(SchemaError) as refused:
        convert_json_schema(json.dumps(schema), dialect="extended", strict=True)
    assert refused.value.pointer == "#/properties"
    grammar = grammar_of(schema, strict=False)
    keys = list(schema["properties"])
    in_order = {key: value_of(schema, key) for key in keys[:-1]}
    assert takes(grammar, pairs_text([*in_order.items(), ("extra", 1)]))
    assert takes(grammar, pairs_text([("extra", 1), *in_order.items()]))
    assert not takes(grammar, pairs_text(list(reversed(in_order.items()))))
    assert not takes(grammar, pairs_text(list(in_order.items())[1:]))  # a required one missing


def test_the_bounds() -> None:
    assert in_any_order([True] * ANY_ORDER_MAX)
    assert in_any_order([True] * REQUIRED_MAX + [False] * 100)
    assert not in_any_order([True] * (REQUIRED_MAX + 1))


def test_allof_merges_the_parts_own_required_properties_in_any_order() -> None:
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                         "required": ["a"]},
                        {"type": "object", "properties": {"c": {"type": "boolean"}}}]}
    grammar = grammar_of(schema)
    cases = [({"c": True, "a": 1}, True), ({"a": 1}, True), ({"b": "x", "a": 1, "z": 0}, True),
             ({"b": "x"}, False), ({"a": 1, "c": 1}, False)]
    for document, expected in cases:
        assert valid(schema, document) == expected
        assert takes(grammar, pairs_text(list(document.items()))) == expected, document


def test_the_default_dialect_keeps_llama_cpps_order() -> None:
    schema = json.dumps(object_schema(3, 1))
    grammar = Grammar.from_gbnf(json_schema_to_gbnf(schema), BYTES)
    assert takes(grammar, '{"p0":1,"p1":"x"}')
    assert not takes(grammar, '{"p1":"x","p0":1}')


def test_unevaluated_properties_false_keeps_the_object_closed() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"],
              "unevaluatedProperties": False}
    conversion = convert_json_schema(json.dumps(schema), dialect="extended")
    # `b` is required but no key beside `a` is allowed: no object is valid, and the report says so
    assert [item.keyword for item in conversion.unenforced] == ["required"]
    closed = {"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False}
    grammar = grammar_of(closed)
    for text in ['{"a":1}', '{"a":1,"b":2}', '{"b":2}']:
        assert takes(grammar, text) == valid(closed, json.loads(text)), text


def test_unevaluated_properties_of_a_schema_are_reported() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}},
              "unevaluatedProperties": {"type": "string"}}
    conversion = convert_json_schema(json.dumps(schema), dialect="extended")
    assert [(item.pointer, item.keyword) for item in conversion.unenforced] == [
        ("#/unevaluatedProperties", "unevaluatedProperties")]
