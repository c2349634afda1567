"""Request resolution (constraintd/engine/chat/requests.py): the constraint an OpenAI or Ollama request
asks for.

The cases follow llama-server's `oaicompat_chat_params_parse` (tools/server/server-common.cpp) and Ollama's
`llamaServerChatResponseFormat`; the JSON-mode grammars are compared with llama.cpp's converter itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from constraintd.engine.chat.requests import (
    ANY_JSON_SCHEMA,
    JSON_OBJECT_SCHEMA,
    AnswerFormat,
    RequestedConstraint,
    RequestGrammar,
    any_json_grammar,
    json_object_grammar,
    read_request,
    resolve_request,
)
from constraintd.engine.schema.convert import convert_json_schema
from constraintd.errors import SchemaError

NONE, OBJECT, SCHEMA, GRAMMAR = (AnswerFormat.NONE, AnswerFormat.JSON_OBJECT, AnswerFormat.JSON_SCHEMA,
                                 AnswerFormat.GRAMMAR)
MESSAGES = [{"role": "user", "content": "hi"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
PERSON_TEXT = '{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}'
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"schema": PERSON}}


def body(**fields: object) -> str:
    return json.dumps({"model": "m", "messages": MESSAGES, **fields})


# (id, request text, kind, schema or grammar text, source)
READS = [
    ("no field", body(), NONE, None, ""),
    ("response_format null", body(response_format=None), NONE, None, ""),
    ("response_format empty", body(response_format={}), NONE, None, ""),
    ("response_format text", body(response_format={"type": "text"}), NONE, None, ""),
    ("type null", body(response_format={"type": None}), NONE, None, ""),
    ("json_object", body(response_format={"type": "json_object"}), OBJECT, JSON_OBJECT_SCHEMA,
     "#/response_format"),
    ("json_object with schema", body(response_format={"type": "json_object", "schema": PERSON}), SCHEMA,
     PERSON_TEXT, "#/response_format/schema"),
    ("json_object with null schema", body(response_format={"type": "json_object", "schema": None}), OBJECT,
     JSON_OBJECT_SCHEMA, "#/response_format/schema"),
    ("json_object with empty schema", body(response_format={"type": "json_object", "schema": {}}), OBJECT,
     JSON_OBJECT_SCHEMA, "#/response_format/schema"),
    ("json_schema", body(response_format={"type": "json_schema",
                                          "json_schema": {"name": "p", "strict": True, "schema": PERSON}}),
     SCHEMA, PERSON_TEXT, "#/response_format/json_schema/schema"),
    ("json_schema without schema",
     body(response_format={"type": "json_schema", "json_schema": {"name": "p"}}), OBJECT, JSON_OBJECT_SCHEMA,
     "#/response_format/json_schema/schema"),
    ("json_schema without wrapper", body(response_format={"type": "json_schema"}), OBJECT, JSON_OBJECT_SCHEMA,
     "#/response_format/json_schema/schema"),
    ("top-level json_schema", body(json_schema=PERSON), SCHEMA, PERSON_TEXT, "#/json_schema"),
    ("top-level empty json_schema", body(json_schema={}), OBJECT, JSON_OBJECT_SCHEMA, "#/json_schema"),
    ("top-level null json_schema", body(json_schema=None), NONE, None, ""),
    ("json_object keeps top-level json_schema",
     body(json_schema=PERSON, response_format={"type": "json_object"}), SCHEMA, PERSON_TEXT, "#/json_schema"),
    ("text keeps top-level json_schema", body(json_schema=PERSON, response_format={"type": "text"}), SCHEMA,
     PERSON_TEXT, "#/json_schema"),
    ("grammar", body(grammar='root ::= "yes" | "no"'), GRAMMAR, 'root ::= "yes" | "no"', "#/grammar"),
    ("empty grammar", body(grammar=""), NONE, None, ""),
    ("grammar beside text format", body(grammar="root ::= [a-z]+", response_format={"type": "text"}), GRAMMAR,
     "root ::= [a-z]+", "#/grammar"),
    ("numbers as written", '{"json_schema": {"type": "number", "minimum": 2.0, "maximum": 10}}', SCHEMA,
     '{"type":"number","minimum":2.0,"maximum":10}', "#/json_schema"),
    ("repeated key: last value", '{"json_schema": {"type": "string", "type": "integer"}}', SCHEMA,
     '{"type":"integer"}', "#/json_schema"),
    ("ollama no format", json.dumps({"model": "m", "messages": MESSAGES, "stream": False}), NONE, None, ""),
    ("ollama null format", json.dumps({"model": "m", "format": None}), NONE, None, ""),
    ("ollama empty format", json.dumps({"model": "m", "format": ""}), NONE, None, ""),
    ("ollama json", json.dumps({"model": "m", "format": "json"}), OBJECT, JSON_OBJECT_SCHEMA, "#/format"),
    ("ollama schema", json.dumps({"model": "m", "format": PERSON}), SCHEMA, PERSON_TEXT, "#/format"),
    ("ollama empty schema", json.dumps({"model": "m", "format": {}}), OBJECT, JSON_OBJECT_SCHEMA, "#/format"),
    ("ollama empty format beside grammar", json.dumps({"format": "", "grammar": "root ::= [a]"}), GRAMMAR,
     "root ::= [a]", "#/grammar"),
]


@pytest.mark.parametrize(("request_text", "kind", "text", "source"), [c[1:] for c in READS],
                         ids=[c[0] for c in READS])
def test_read_request(request_text: str, kind: AnswerFormat, text: str | None, source: str) -> None:
    asks_strict = '"strict": true' in request_text  # the one case of OpenAI's strict structured output
    assert read_request(request_text) == RequestedConstraint(kind, text, source, asks_strict)


# (id, request text, reason, pointer)
REFUSALS = [
    ("not JSON", '{"response_format": ', "invalid JSON", "#"),
    ("not an object", "[1, 2]", "a request must be a JSON object", "#"),
    ("grammar and json_schema", body(grammar="root ::= [a]", json_schema=PERSON),
     "Cannot use both json_schema and grammar", "#/grammar"),
    ("grammar and json_object", body(grammar="root ::= [a]", response_format={"type": "json_object"}),
     "Cannot use both response_format and grammar", "#/grammar"),
    ("grammar and json_schema format", body(grammar="root ::= [a]", response_format={
        "type": "json_schema", "json_schema": {"schema": PERSON}}),
     "Cannot use both response_format and grammar", "#/grammar"),
    ("two schemas", body(json_schema=PERSON, response_format={"type": "json_schema", "json_schema": {
        "schema": {"type": "integer"}}}), "Cannot use both json_schema and a response_format schema",
     "#/json_schema"),
    ("two schemas via json_object", body(json_schema=PERSON, response_format={"type": "json_object",
                                                                              "schema": PERSON}),
     "Cannot use both json_schema and a response_format schema", "#/json_schema"),
    ("unknown type", body(response_format={"type": "yaml"}),
     'response_format type must be one of "text" or "json_object", but got: yaml', "#/response_format/type"),
    ("response_format a string", body(response_format="json_object"), "response_format must be an object",
     "#/response_format"),
    ("type not a string", body(response_format={"type": 1}), "response_format type must be a string",
     "#/response_format/type"),
    ("json_schema wrapper not an object", body(response_format={"type": "json_schema", "json_schema": "p"}),
     "response_format json_schema must be an object", "#/response_format/json_schema"),
    ("grammar not a string", body(grammar=["root ::= [a]"]), "grammar must be a string of GBNF", "#/grammar"),
    ("ollama yaml", json.dumps({"model": "m", "format": "yaml"}),
     'invalid format: "\\"yaml\\""; expected "json" or a valid JSON Schema object', "#/format"),
    ("ollama array", json.dumps({"model": "m", "format": [1]}),
     'invalid format: "[1]"; expected "json" or a valid JSON Schema object', "#/format"),
    ("ollama format and response_format", json.dumps({"format": "json", "response_format": {"type": "text"}}),
     "Cannot use both format and response_format", "#/response_format"),
    ("ollama format and grammar", json.dumps({"format": PERSON, "grammar": "root ::= [a]"}),
     "Cannot use both format and grammar", "#/grammar"),
]


@pytest.mark.parametrize(("request_text", "reason", "pointer"), [c[1:] for c in REFUSALS],
                         ids=[c[0] for c in REFUSALS])
def test_refusals(request_text: str, reason: str, pointer: str) -> None:
    with pytest.raises(SchemaError) as caught:
        read_request(request_text)
    assert caught.value.reason.startswith(reason)
    assert caught.value.pointer == pointer
    with pytest.raises(SchemaError):
        resolve_request(request_text)


def test_resolve_schema_is_the_converters_grammar() -> None:
    conversion = convert_json_schema(PERSON_TEXT)
    resolved = resolve_request(body(response_format=PERSON_FORMAT))
    assert resolved == RequestGrammar(SCHEMA, conversion.grammar, "root", tuple(conversion.warnings),
                                  "#/response_format/json_schema/schema", PERSON_TEXT)


@pytest.mark.parametrize("request_text", [body(response_format={"type": "json_object"}),
                                          json.dumps({"format": "json"}), body(json_schema={})],
                         ids=["openai json_object", "ollama json", "empty schema"])
def test_resolve_json_mode(request_text: str) -> None:
    resolved = resolve_request(request_text)
    assert resolved.kind is OBJECT
    assert resolved.gbnf == json_object_grammar() == convert_json_schema('{"type": "object"}').grammar
    assert resolved.schema == JSON_OBJECT_SCHEMA


def test_resolve_grammar_and_none() -> None:
    grammar = 'root ::= "a"'
    assert resolve_request(body(grammar=grammar)) == RequestGrammar(GRAMMAR, grammar, source="#/grammar")
    assert resolve_request(body()) == RequestGrammar(NONE, None)


def test_resolve_keeps_float_text() -> None:
    schema = '{"type": "number", "minimum": 2.0}'
    resolved = resolve_request(f'{{"json_schema": {schema}}}')
    assert resolved.gbnf == convert_json_schema(schema).grammar
    assert resolved.schema == '{"type":"number","minimum":2.0}'


AGED = {"type": "object", "properties": {"age": {"type": "number", "minimum": 0}}}


@pytest.mark.parametrize(
    ("request_text", "source"),
    [(body(response_format={"type": "json_schema", "json_schema": {"schema": AGED}}),
      "#/response_format/json_schema/schema"),
     (body(json_schema=AGED), "#/json_schema"),
     (json.dumps({"format": AGED}), "#/format")],
    ids=["openai response_format", "top-level json_schema", "ollama format"],
)
def test_the_report_points_into_the_request(request_text: str, source: str) -> None:
    resolved = resolve_request(request_text)
    pointer = f"{source}/properties/age/minimum"
    assert [(item.pointer, item.keyword) for item in resolved.unenforced] == [(pointer, "minimum")]
    assert resolved.warnings == (f"{pointer}: minimum: bounds on a non-integer number are not enforced",)
    with pytest.raises(SchemaError) as refused:
        resolve_request(request_text, strict=True)
    assert refused.value.pointer == pointer
    assert refused.value.reason.startswith("strict: ")


def test_strict_takes_what_the_grammar_holds() -> None:
    for request_text in (body(response_format=PERSON_FORMAT), body(response_format={"type": "json_object"}),
                         body(grammar='root ::= "a"'), body()):
        assert resolve_request(request_text, strict=True) == resolve_request(request_text)


def test_openai_strict_is_told_not_acted_on() -> None:
    asked = body(response_format={"type": "json_schema", "json_schema": {"strict": True, "schema": AGED}})
    resolved = resolve_request(asked)
    assert resolved.asks_strict and resolved.unenforced  # converted leniently all the same
    wrapper = {"strict": "yes", "schema": AGED}
    not_asked = body(response_format={"type": "json_schema", "json_schema": wrapper})
    assert not resolve_request(not_asked).asks_strict


@pytest.mark.parametrize(
    ("schema", "source", "wrap"),
    [
        ({"type": "object", "properties": {"a": {"type": "no-such-type"}}}, "#/json_schema",
         lambda s: body(json_schema=s)),
        ({"$ref": "#/$defs/missing"}, "#/response_format/json_schema/schema",
         lambda s: body(response_format={"type": "json_schema", "json_schema": {"schema": s}})),
        ("not a schema", "#/format", lambda s: json.dumps({"format": {"anyOf": s}})),
    ],
    ids=["unknown type", "missing ref", "anyOf not an array"],
)
def test_converter_refusal_points_into_the_request(schema: object, source: str,
                                                   wrap: Callable[[object], str]) -> None:
    request_text = wrap(schema)
    inner = json.loads(request_text)
    for key in source.split("/")[1:]:
        inner = inner[key]
    with pytest.raises(SchemaError) as direct:
        convert_json_schema(json.dumps(inner))
    with pytest.raises(SchemaError) as caught:
        resolve_request(request_text)
    assert caught.value.reason == direct.value.reason
    assert caught.value.pointer == source + direct.value.pointer.removeprefix("#")


@pytest.mark.oracle
def test_json_mode_grammars_are_llama_cpps(llama_cpp_dir: Path) -> None:
    from tests.schema_oracle.build import harness_binary, run_harness

    binary = harness_binary(llama_cpp_dir)
    pairs = [(JSON_OBJECT_SCHEMA, json_object_grammar()), (ANY_JSON_SCHEMA, any_json_grammar())]
    for schema, grammar in pairs:
        answer = run_harness(binary, schema.encode())
        assert answer.code == 0, answer.out
        assert answer.out.decode() == grammar, schema
