"""Constraints (constraintd/service/constraints.py): the report travels as warnings, strict refuses, keys."""

from __future__ import annotations

import json
from typing import Final

import pytest

from constraintd.engine.schema.convert import convert_json_schema
from constraintd.errors import SchemaError
from constraintd.service.constraints import Constraint, ConstraintKind, prepare, resolve

VOCAB_HASH: Final = "v" * 64
AGE: Final = json.dumps({"type": "object", "properties": {"age": {"type": "number", "minimum": 0},
                                                          "name": {"type": "string", "pattern": "x"}}})
AGE_REPORT: Final = (
    "pattern x is not supported (not anchored with '^' and '$'), accepting any string",
    "#/properties/age/minimum: minimum: bounds on a non-integer number are not enforced",
)
OLLAMA_AGE: Final = json.dumps({"format": json.loads(AGE)})
HELD: Final = json.dumps({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}})


def openai(schema: str) -> str:
    return json.dumps({"messages": [], "response_format": {"type": "json_schema", "json_schema": {
        "name": "s", "strict": True, "schema": json.loads(schema)}}})


def test_keys_without_strict_are_what_they_were() -> None:
    # digests of the key as it was before `strict` existed: caches keyed by them stay valid
    schema = Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "integer"}')
    assert schema.key(VOCAB_HASH) == "a8eb30a396db296925ef8a78c320d797f3d2bf8ef1493ba890a3ec621a44241d"
    gbnf = Constraint(ConstraintKind.GBNF, 'root ::= "a"', "root", ("x",), (7,))
    assert gbnf.key(VOCAB_HASH) == "e335629e76b75eb3ed9b825e462a37e22c9135452d5f4ba4c960f67eedd78606"


def test_strict_is_part_of_the_key() -> None:
    lenient = Constraint(ConstraintKind.JSON_SCHEMA, AGE)
    strict = Constraint(ConstraintKind.JSON_SCHEMA, AGE, strict=True)
    assert strict.key(VOCAB_HASH) != lenient.key(VOCAB_HASH)
    # a pattern standing for "strict" is not the flag
    patterned = Constraint(ConstraintKind.JSON_SCHEMA, AGE, trigger_patterns=("strict",))
    assert patterned.key(VOCAB_HASH) != strict.key(VOCAB_HASH)


@pytest.mark.parametrize(("kind", "text"), [(ConstraintKind.JSON_SCHEMA, AGE),
                                            (ConstraintKind.OPENAI_REQUEST, openai(AGE)),
                                            (ConstraintKind.OLLAMA_REQUEST, OLLAMA_AGE)],
                         ids=["schema", "openai", "ollama"])
def test_the_report_travels_as_warnings(kind: ConstraintKind, text: str) -> None:
    resolved = resolve(Constraint(kind, text))
    assert resolved.gbnf == convert_json_schema(AGE).grammar
    if kind is ConstraintKind.JSON_SCHEMA:
        assert resolved.warnings == AGE_REPORT
    else:  # the pointer is the keyword's place in the request
        assert resolved.warnings[0] == AGE_REPORT[0]
        assert resolved.warnings[1].endswith(AGE_REPORT[1][1:])


@pytest.mark.parametrize(
    ("kind", "text", "pointer"),
    [(ConstraintKind.JSON_SCHEMA, AGE, "#/properties/age/minimum"),
     (ConstraintKind.OPENAI_REQUEST, openai(AGE),
      "#/response_format/json_schema/schema/properties/age/minimum"),
     (ConstraintKind.OLLAMA_REQUEST, OLLAMA_AGE, "#/format/properties/age/minimum")],
    ids=["schema", "openai", "ollama"],
)
def test_strict_refuses_the_first_unenforced_keyword(kind: ConstraintKind, text: str, pointer: str) -> None:
    # the report lists llama.cpp's pattern warning first, but in document order `age` comes first
    for step in (resolve, prepare):
        with pytest.raises(SchemaError) as refused:
            step(Constraint(kind, text, strict=True))
        assert refused.value.pointer == pointer
        assert refused.value.reason.startswith("strict: the grammar would not enforce minimum")


@pytest.mark.parametrize(("kind", "text"), [(ConstraintKind.JSON_SCHEMA, HELD),
                                            (ConstraintKind.OPENAI_REQUEST, openai(HELD)),
                                            (ConstraintKind.JSON_OBJECT, ""),
                                            (ConstraintKind.GBNF, 'root ::= "a"')],
                         ids=["schema", "openai", "json_object", "gbnf"])
def test_strict_takes_what_the_grammar_holds(kind: ConstraintKind, text: str) -> None:
    strict = prepare(Constraint(kind, text, strict=True))
    assert strict.resolved == resolve(Constraint(kind, text))
    assert strict.resolved.warnings == ()


def test_a_requests_own_strict_is_not_acted_on() -> None:
    # OpenAI's `strict: true` in the body does not make the conversion strict: the constraint's flag does
    assert resolve(Constraint(ConstraintKind.OPENAI_REQUEST, openai(AGE))).warnings[1:]


EXTENDED_HELD: Final = json.dumps({"type": "object", "properties": {
    "n": {"type": "integer", "minimum": 100}, "day": {"type": "string", "format": "date"}}})


def test_the_dialect_is_part_of_the_key_when_not_the_default() -> None:
    default = Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "integer"}')
    assert Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "integer"}', dialect="llama.cpp").key(
        VOCAB_HASH) == default.key(VOCAB_HASH)
    extended = Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "integer"}', dialect="extended")
    assert extended.key(VOCAB_HASH) != default.key(VOCAB_HASH)
    strict = Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "integer"}', strict=True, dialect="extended")
    assert len({strict.key(VOCAB_HASH), extended.key(VOCAB_HASH), default.key(VOCAB_HASH)}) == 3


@pytest.mark.parametrize(("kind", "text"), [(ConstraintKind.JSON_SCHEMA, EXTENDED_HELD),
                                            (ConstraintKind.OPENAI_REQUEST, openai(EXTENDED_HELD)),
                                            (ConstraintKind.OLLAMA_REQUEST,
                                             json.dumps({"format": json.loads(EXTENDED_HELD)}))],
                         ids=["schema", "openai", "ollama"])
def test_the_dialect_reaches_the_converter(kind: ConstraintKind, text: str) -> None:
    with pytest.raises(SchemaError):
        resolve(Constraint(kind, text, strict=True))
    resolved = resolve(Constraint(kind, text, strict=True, dialect="extended"))
    assert resolved.gbnf == convert_json_schema(EXTENDED_HELD, dialect="extended").grammar
    assert resolved.warnings == ()


def test_an_unknown_dialect_is_refused() -> None:
    with pytest.raises(SchemaError, match="unknown schema dialect"):
        resolve(Constraint(ConstraintKind.JSON_SCHEMA, HELD, dialect="other"))
