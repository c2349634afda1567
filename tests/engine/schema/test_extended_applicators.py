"""The extended dialect's reading of types and applicators (constraintd/engine/schema/extended.py): an
object without `type`, `type` beside oneOf/anyOf and `$ref`, and what strict refuses. Each document is
judged by `jsonschema` (2020-12) and by the grammar, on its bytes."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# ------------------------------------------------------------------ keywords beside oneOf / anyOf, merged

SHAPES: dict[str, Any] = {
    "type": "object",
    "properties": {"radius": {"type": "number"}, "side": {"type": "number"}, "base": {"type": "number"},
                   "height": {"type": "number"}},
}
SHAPE_ALTERNATIVES: list[Any] = [{"required": ["radius"]}, {"required": ["side"]},
                                 {"required": ["base", "height"]}]


def key_sets(names: list[str], extra: str = "other") -> list[str]:
    # every subset of the names (and another key), each value 1, then a wrong value for the first
    documents = []
    every = [*names, extra]
    for mask in range(1 << len(every)):
        chosen = [name for i, name in enumerate(every) if mask >> i & 1]
        documents.append(json.dumps({name: 1 for name in chosen}, separators=(",", ":")))
        if chosen:
            documents.append(json.dumps({**{name: 1 for name in chosen}, chosen[0]: "x"},
                                        separators=(",", ":")))
    return documents


@pytest.mark.parametrize("key", ["oneOf", "anyOf"])
@pytest.mark.parametrize("closed", [False, True], ids=["open", "closed"])
def test_required_alternatives_beside_properties(key: str, closed: bool) -> None:
    schema = {**SHAPES, key: SHAPE_ALTERNATIVES}
    if closed:
        schema["additionalProperties"] = False
    check(schema, [*key_sets(list(SHAPES["properties"])), '"text"', "[]"])


def test_a_one_of_without_type_beside_properties_takes_objects_only() -> None:
    schema = {"properties": SHAPES["properties"], "oneOf": SHAPE_ALTERNATIVES[:2]}
    check(schema, [*key_sets(["radius", "side"]), '"text"', "1", "null"])


def test_tagged_alternatives_beside_properties() -> None:
    # the alternatives' const tags meet the base's property: disjoint, so oneOf is anyOf
    schema = {"type": "object", "properties": {"kind": {"type": "string"}, "size": {"type": "integer"}},
              "required": ["kind"],
              "oneOf": [{"properties": {"kind": {"const": "a"}}},
                        {"properties": {"kind": {"enum": ["b", "c", 3]}, "size": {}}, "required": ["size"]}]}
    documents = [f'{{"kind":{kind}{size}}}' for kind in ('"a"', '"b"', '"c"', "3", '"d"')
                 for size in ("", ',"size":1', ',"size":"x"')]
    check(schema, documents)
    conversion = convert_json_schema(json.dumps(schema), strict=True, dialect="extended")
    assert conversion.unenforced == ()


def test_required_names_the_base_does_not_declare() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}},
              "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    check(schema, key_sets(["a", "b"]))
    closed = {**schema, "additionalProperties": False}
    check(closed, key_sets(["a", "b"]))
    typed = {**schema, "additionalProperties": {"type": "string"}}
    check(typed, [*key_sets(["a", "b"]), '{"b":"x"}', '{"a":1,"b":"x"}'])


def test_what_the_merge_cannot_write_stays_reported() -> None:
    # an alternative with a keyword of its own that is no required name or property
    schema = {"type": "object", "properties": {"a": {"type": "integer"}},
              "oneOf": [{"required": ["a"], "minProperties": 2}, {"required": ["b"]}]}
    with pytest.raises(SchemaError, match=r"oneOf|minProperties"):
        convert_json_schema(json.dumps(schema), strict=True, dialect="extended")
    # a property both declare, which no exact merge writes
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}},
              "oneOf": [{"properties": {"a": {"maximum": 5}}}, {"required": ["b"]}]}
    with pytest.raises(SchemaError, match="oneOf"):
        convert_json_schema(json.dumps(schema), strict=True, dialect="extended")


def test_merged_alternatives_leave_the_default_dialect_as_it_was() -> None:
    schema = json.dumps({**SHAPES, "oneOf": SHAPE_ALTERNATIVES})
    with pytest.raises(SchemaError, match="oneOf"):
        convert_json_schema(schema, strict=True)


# ------------------------------------------------------------------------------------ property counts

MAPS = ['{}', '{"a":1}', '{"a":1,"b":2}', '{"a":1,"b":2,"c":3}', '{"a":1,"b":2,"c":3,"d":4}', '{"a":"x"}',
        '{"a":1,"b":"x"}']


@pytest.mark.parametrize(("low", "high"), [(1, None), (2, None), (0, 2), (2, 3), (3, 3), (None, 0), (4, 4)])
@pytest.mark.parametrize("values", [{"type": "integer"}, True], ids=["integers", "any"])
def test_the_counts_of_a_map(low: int | None, high: int | None, values: Any) -> None:
    schema: dict[str, Any] = {"type": "object", "additionalProperties": values}
    if low is not None:
        schema["minProperties"] = low
    if high is not None:
        schema["maxProperties"] = high
    check(schema, MAPS)


@pytest.mark.parametrize("closed", [False, True], ids=["open", "closed"])
def test_min_properties_1_beside_properties(closed: bool) -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}},
                              "minProperties": 1}
    if closed:
        schema["additionalProperties"] = False
    check(schema, MAPS)


def test_min_properties_1_of_pattern_keys() -> None:
    schema = {"type": "object", "patternProperties": {"^[a-c]+$": {"type": "integer"}},
              "additionalProperties": False, "minProperties": 2}
    check(schema, [*MAPS, '{"a":1,"z":2}'])


def test_counts_the_grammar_cannot_hold_stay_reported() -> None:
    schema = {"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "minProperties": 2}
    with pytest.raises(SchemaError, match="minProperties"):
        convert_json_schema(json.dumps(schema), strict=True, dialect="extended")
    schema = {"type": "object", "properties": {"a": {}}, "maxProperties": 2}
    with pytest.raises(SchemaError, match="maxProperties"):
        convert_json_schema(json.dumps(schema), strict=True, dialect="extended")
    schema = {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 10**9}
    with pytest.raises(SchemaError, match="minProperties"):
        convert_json_schema(json.dumps(schema), strict=True, dialect="extended")


# ------------------------------------------------------------------- const / enum beside other keywords

VALUES = ['"a"', '"abcd"', "1", "1.0", "2.5", "7", "-3", "null", "true", "[]", "[1,2]", "{}", '{"a":1}']


@pytest.mark.parametrize("beside", [
    {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": ["string", "null"]},
    {"minLength": 2}, {"maxLength": 1}, {"minimum": 1}, {"exclusiveMaximum": 7}, {"maximum": 1.5},
    {"minItems": 1}, {"maxProperties": 0}, {"type": "number", "minimum": 1, "exclusiveMinimum": 1},
], ids=str)
def test_listed_values_beside_other_keywords(beside: dict[str, Any]) -> None:
    listed = [json.loads(text) for text in VALUES]
    schema = {"enum": listed, **beside}
    check(schema, VALUES)
    conversion = convert_json_schema(json.dumps(schema), strict=True, dialect="extended")
    assert conversion.unenforced == ()


def test_draft_4_exclusive_flags_beside_an_enum() -> None:
    schema = {"enum": [1, 2, 3], "minimum": 1, "exclusiveMinimum": True, "maximum": 3,
              "exclusiveMaximum": False}
    grammar = grammar_of(schema)
    assert [takes(grammar, text) for text in ("1", "2", "3")] == [False, True, True]


def test_an_optional_property_no_value_is_valid_for_is_absent() -> None:
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"], "type": "object"},
                                               "b": {"type": "integer"}}}
    check(schema, ['{}', '{"a":"x"}', '{"b":1}', '{"b":1,"a":"y"}', '{"c":1}', '{"a":{}}'])


def test_a_keyword_the_values_are_not_checked_against_stays_reported() -> None:
    schema = {"enum": ["a", "b"], "pattern": "^a$"}
    with pytest.raises(SchemaError, match="pattern"):
        convert_json_schema(json.dumps(schema), strict=True, dialect="extended")


# ------------------------------------------------------------------------------------------------ email

_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_MAILBOX = re.compile(
    rf'(?:{_ATEXT}+(?:\.{_ATEXT}+)*|"(?:[ !#-\[\]-~]|\\[ -~])*")@'
    rf"(?:{_LABEL}(?:\.{_LABEL})*|\[(?:[0-9.]+|[iI][pP][vV]6:[0-9A-Fa-f:.]+)\])"
)


def rfc5321_mailbox(text: str) -> bool:
    # RFC 5321 section 4.1.2's Mailbox, address literals of IPv4 and IPv6 (checked by jsonschema's readers)
    match = _MAILBOX.fullmatch(text)
    if match is None:
        return False
    literal = re.search(r"@\[(?:[iI][pP][vV]6:)?(.*)\]$", text)
    if literal is None:
        return True
    kind = "ipv6" if text[text.rindex("@") + 2 :].lower().startswith("ipv6:") else "ipv4"
    return valid({"format": kind}, literal.group(1))


EMAILS = [
    "joe.bloggs@example.com", "te~st@example.com", "~test@example.com", "test~@example.com",
    '"joe bloggs"@example.com', '"joe..bloggs"@example.com', '"joe@bloggs"@example.com',
    '"a\\"b"@x.org', '"a\\\\b"@x.org', "joe.bloggs@[127.0.0.1]", "joe.bloggs@[IPv6:::1]", "a@b", "1@2.3",
    "x@a-b.c", "!#$%&'*+/=?^_`{|}~-@x.io",
    # invalid
    "2962", ".test@example.com", "test.@example.com", "te..st@example.com", "joe.bloggs@invalid=domain.com",
    "joe.bloggs@[127.0.0.300]", "joe.bloggs@[IPv6:::12345]", "a@-b.c", "a@b-.c", "a@.b", "a@b.", "@b.c",
    "a@", "a b@c.d", '"a"b"@c.d', "ä@b.c", "a@b@c", '"a\nb"@c.d', "a@[1.2.3.4", "a@[x:y]",
]


@pytest.mark.parametrize("text", EMAILS)
def test_email(text: str) -> None:
    grammar = grammar_of({"type": "string", "format": "email"})
    assert takes(grammar, json.dumps(text, ensure_ascii=False)) == rfc5321_mailbox(text)
    if rfc5321_mailbox(text):
        assert valid({"format": "email"}, text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "Z9", ".", "@", "-", '"', "\\", " ", "[", "]", "1.2.3.4", "IPv6:",
                                 "::1", "~", "x.y", "é"]), max_size=8).map("".join))
def test_random_emails(text: str) -> None:
    grammar = grammar_of({"type": "string", "format": "email"})
    assert takes(grammar, json.dumps(text, ensure_ascii=False)) == rfc5321_mailbox(text), text


# ------------------------------------------------------------------- patternProperties, keys split

PATTERN_CASES: list[dict[str, Any]] = [
    {"type": "object", "patternProperties": {".": {"type": "integer"}}},
    {"type": "object", "patternProperties": {"\\w+": {"type": "integer"}}},
    {"type": "object", "patternProperties": {"[0-9a-f]{2}": {"type": "integer"}}},
    {"type": "object", "patternProperties": {"^a.c$": {"type": "integer"}, "^b": {"type": "string"}}},
    {"type": "object", "patternProperties": {"^a": {"type": "integer"}, "b$": {}},
     "additionalProperties": {"type": "string"}},
    {"type": "object", "patternProperties": {"^[ab]+$": {"type": "integer"}}, "additionalProperties": False,
     "properties": {"x": {"type": "string"}}},
    {"type": "object", "patternProperties": {"^x_": {"type": "integer"}}, "properties": {"y": {}},
     "required": ["x_1", "y"]},
    {"type": "object", "patternProperties": {"\\n|\"": {"type": "integer"}}},
]
# ASCII only: jsonschema reads `\w` as Python does (Unicode letters too), ECMA-262 as ASCII; no newline
# before a key's end: Python's `$` matches there, ECMA-262's does not
PATTERN_KEYS = ["", "a", "b", "ab", "abc", "aXc", "ba", "x", "x_1", "y", "0f", "0g", "-", "a\nb", 'q"', "a c",
                "\\"]


@pytest.mark.parametrize("schema", PATTERN_CASES, ids=lambda schema: json.dumps(schema)[:60])
def test_pattern_properties_split_keys(schema: dict[str, Any]) -> None:
    conversion = convert_json_schema(json.dumps(schema), strict=True, dialect="extended")
    assert conversion.unenforced == ()
    documents = ["{}"]
    for key in PATTERN_KEYS:
        for value in ("1", '"s"'):
            documents.append("{" + json.dumps(key, ensure_ascii=False) + ":" + value + "}")
    documents += ['{"x_1":1,"y":2}', '{"y":2,"x_1":"s"}', '{"x_1":1,"y":2,"ab":3}', '{"a":1,"ab":"s"}',
                  '{"x":"s","a":1}']
    check(schema, documents)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(alphabet="abcx_0f \"", max_size=4), st.sampled_from([1, "s", None]),
                       max_size=3),
       st.sampled_from(PATTERN_CASES))
def test_random_keys_of_split_patterns(document: dict[str, Any], schema: dict[str, Any]) -> None:
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    assert takes(grammar_of(schema), text) == valid(schema, document), text


def test_word_characters_are_ascii() -> None:
    grammar = grammar_of({"type": "object", "patternProperties": {"\\w": {"type": "integer"}}})
    assert takes(grammar, '{"é":"s"}')
    assert not takes(grammar, '{"éa":"s"}')


def test_two_patterns_of_different_schemas_on_one_key_stay_reported() -> None:
    schema = {"type": "object", "patternProperties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    with pytest.raises(SchemaError, match="patternProperties"):
        convert_json_schema(json.dumps(schema), strict=True, dialect="extended")


ARTIFACTS: list[Any] = [
    {"properties": {"image": {"type": "string"}, "context": {"type": "string"}},
     "additionalProperties": False},
    {"properties": {"image": {"type": "string"}, "docker": {"type": "object"}},
     "additionalProperties": False},
    {"properties": {"name": {"type": "string"}}},
]


@pytest.mark.parametrize("typed", [False, True], ids=["no type", "type object"])
def test_required_beside_an_any_of_joins_each_alternative(typed: bool) -> None:
    schema: dict[str, Any] = {"description": "an artifact", "required": ["image"], "anyOf": ARTIFACTS}
    if typed:
        schema["type"] = "object"
    documents = ['{}', '{"image":"x"}', '{"image":1}', '{"image":"x","context":"c"}', '{"context":"c"}',
                 '{"image":"x","docker":{}}', '{"image":"x","docker":1}', '{"image":"x","name":"n"}',
                 '{"name":"n"}', '{"image":"x","context":"c","docker":{}}', '"text"', "1", "[]"]
    check(schema, documents)
    conversion = convert_json_schema(json.dumps(schema), strict=True, dialect="extended")
    assert conversion.unenforced == ()


NOT_REQUIRED_DOCUMENTS = ['{"a":1}', '{"a":1,"b":2}', '{"a":1,"c":3}', '{"a":1,"b":2,"c":3}', '{"b":2,"c":3}',
                          '{}', '{"a":"x","b":2}', '{"a":1,"d":4}', '"text"', "12", "null", "[]"]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}, "c": {}}, "required": ["a"],
         "additionalProperties": False, "not": {"allOf": [{"required": ["b"]}, {"required": ["c"]}]}},
        {"properties": {"a": {"type": "integer"}}, "not": {"required": ["b", "c"], "title": "t"}},
        {"type": "object", "required": ["b"], "not": {"required": ["b", "c"]}},
    ],
    ids=["allOf-of-required", "untyped", "one-name-required"],
)
def test_a_not_of_required_names_takes_the_objects_missing_one(schema: dict[str, Any]) -> None:
    # not every one of the names present; a value that is no object is valid for `required`, so for no such
    # `not`: jsonschema judges each document
    assert convert_json_schema(json.dumps(schema), dialect="extended").unenforced == ()
    check(schema, NOT_REQUIRED_DOCUMENTS)


@pytest.mark.parametrize(
    "schema",
    [{"type": "object", "not": {"type": "object", "required": ["a"]}},
     {"type": "object", "required": ["a"], "not": {"required": ["a"]}},
     {"type": "object", "patternProperties": {"^b": {}}, "not": {"required": ["b"]}}],
    ids=["typed-not", "nothing-valid", "beside-patternProperties"],
)
def test_another_not_stays_reported(schema: dict[str, Any]) -> None:
    with pytest.raises(SchemaError, match="not"):
        convert_json_schema(json.dumps(schema), strict=True, dialect="extended")


DEPENDENT_DOCUMENTS = ['{}', '{"a":1}', '{"a":1,"b":2}', '{"a":1,"b":2,"c":3}', '{"c":3}', '{"b":2,"c":3}',
                       '{"c":3,"d":4}', '{"d":4}', '{"a":"x","b":2}', '{"a":1,"b":2,"d":4}', '"text"', "12",
                       "[]"]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}, "c": {}},
         "dependentRequired": {"a": ["b"], "c": ["a", "b"]}},
        {"properties": {"a": {"type": "integer"}, "b": {}}, "dependentRequired": {"a": ["b"]},
         "additionalProperties": False},
        {"type": "object", "properties": {"a": {}, "d": {}}, "required": ["d"],
         "dependentRequired": {"d": ["c"], "a": []}},
    ],
    ids=["two-names", "untyped-closed", "required-dependent"],
)
def test_dependent_required_names_take_the_objects_that_hold_them(schema: dict[str, Any]) -> None:
    # each dependent name absent, or present with its names; jsonschema judges each document
    assert convert_json_schema(json.dumps(schema), dialect="extended").unenforced == ()
    check(schema, DEPENDENT_DOCUMENTS)


def test_draft_7s_dependencies_of_names_are_dependent_required_names() -> None:
    schema = {"type": "object", "properties": {"a": {}, "b": {}}, "dependencies": {"a": ["b"]}}
    assert convert_json_schema(json.dumps(schema), dialect="extended").unenforced == ()
    grammar = grammar_of(schema)
    for text in DEPENDENT_DOCUMENTS:
        expected = jsonschema.Draft7Validator(schema).is_valid(json.loads(text))
        assert takes(grammar, text) == expected, text


def test_a_dependent_schema_stays_reported() -> None:
    schema = {"type": "object", "dependencies": {"a": {"required": ["b"]}}}
    with pytest.raises(SchemaError, match="dependencies"):
        convert_json_schema(json.dumps(schema), strict=True, dialect="extended")
