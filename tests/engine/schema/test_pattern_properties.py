"""The extended dialect's patternProperties (constraintd/engine/schema/extended.py, `pattern_keys`): checked
on raw bytes against a validator of JSON Schema 2020-12 (`jsonschema`)."""

from __future__ import annotations

import json
from typing import Any, Final

import pytest

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.schema.convert import convert_json_schema, json_schema_to_gbnf

jsonschema = pytest.importorskip("jsonschema")

BYTES: Final = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])


def takes(schema: dict[str, Any], text: str) -> bool:
    gbnf = json_schema_to_gbnf(json.dumps(schema), strict=True, dialect="extended")
    grammar = Grammar.from_gbnf(gbnf, BYTES)
    matcher = Matcher(grammar)
    return matcher.accept_bytes(text.encode()) and matcher.is_complete()


def valid(schema: dict[str, Any], text: str) -> bool:
    return bool(jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)))


CLOSED: Final = {"type": "object", "patternProperties": {"^[a-z]+[0-9]?$": {"type": "integer"}},
                 "additionalProperties": False}
EVERY: Final = {"type": "object", "patternProperties": {".*": {"type": "integer"}}}
BESIDE: Final = {"type": "object", "properties": {"ID": {"type": "string"}}, "required": ["ID"],
                 "patternProperties": {"^[a-z]+$": {"type": "boolean"}}, "additionalProperties": False}
ANY_VALUE: Final = {"type": "object", "properties": {"a": {"type": "string"}},
                    "patternProperties": {"^.*": {}}, "additionalProperties": False}


@pytest.mark.parametrize(("schema", "text"), [
    (CLOSED, "{}"), (CLOSED, '{"ab":1}'), (CLOSED, '{"ab1":1,"c":2}'), (CLOSED, '{"A":1}'),
    (CLOSED, '{"ab":"x"}'), (CLOSED, '{"":1}'), (CLOSED, '{"ab12":1}'), (CLOSED, '{"ab-":1}'),
    # (not "ab\n": Python's `$`, the validator's, matches before a final newline; ECMA-262's does not)
    (EVERY, "{}"), (EVERY, '{"ab":1}'), (EVERY, '{"A":1,"":2}'), (EVERY, '{"ab":"x"}'),
    (EVERY, '{"a\\nb":1}'),
    (BESIDE, '{"ID":"x"}'), (BESIDE, '{"ab":true,"ID":"x","c":false}'), (BESIDE, '{"ID":"x","ab":1}'),
    (BESIDE, '{"ID":"x","Ab":true}'), (BESIDE, '{"ab":true}'), (BESIDE, '{"ID":true}'),
    (ANY_VALUE, '{"a":"x","b":[1]}'), (ANY_VALUE, '{"b":null}'), (ANY_VALUE, '{"a":1}'),
], ids=lambda value: value if isinstance(value, str) else "")
def test_pattern_keys_are_taken_exactly_when_valid(schema: dict[str, Any], text: str) -> None:
    assert convert_json_schema(json.dumps(schema), dialect="extended").unenforced == ()
    assert takes(schema, text) == valid(schema, text), text


NARROW: Final = {"type": "object", "patternProperties": {"^[a-z_]+$": {"type": "integer"}}}
NARROW_BESIDE: Final = {"type": "object", "patternProperties": {"^.+$": {"type": "integer"}},
                        "additionalProperties": {"type": "string"}}


@pytest.mark.parametrize(("schema", "text"), [
    (NARROW, "{}"), (NARROW, '{"ab":1}'), (NARROW, '{"ab":"x"}'), (NARROW, '{"A":"x"}'), (NARROW, '{"":"x"}'),
    (NARROW, '{"a-b":[1],"c":2}'), (NARROW, '{"c":2,"a-b":[1]}'), (NARROW, '{"a\\nb":"x"}'),
    (NARROW, '{"\\"":null}'), (NARROW_BESIDE, '{"ab":1}'), (NARROW_BESIDE, '{"ab":"x"}'),
    (NARROW_BESIDE, '{"":"x"}'), (NARROW_BESIDE, '{"":1}'), (NARROW_BESIDE, '{"a\\nb":"x"}'),
    (NARROW_BESIDE, '{"a\\nb":1}'),  # (not U+2028: Python's `.` takes it, ECMA-262's does not)
], ids=lambda value: value if isinstance(value, str) else "")
def test_other_keys_beside_one_class_are_its_complement(schema: dict[str, Any], text: str) -> None:
    assert convert_json_schema(json.dumps(schema), dialect="extended").unenforced == ()
    assert takes(schema, text) == valid(schema, text), text


def test_a_key_spelled_with_an_escape_it_does_not_need_is_refused() -> None:
    # `\u0041` is A, a key outside the pattern: valid, but refused as the dialect refuses needless escapes
    assert valid(NARROW, '{"\\u0041":"x"}')
    assert not takes(NARROW, '{"\\u0041":"x"}')
    assert not takes(NARROW, '{"\\u0061":"x"}')  # `a`, the pattern's, with a value that is not its


@pytest.mark.parametrize("schema", [
    # a declared name the pattern matches: its value would need both schemas
    {"type": "object", "properties": {"ab": {"type": "integer"}}, "patternProperties": {"^a": {"minimum": 3}},
     "additionalProperties": False},
    # two patterns of different schemas that may match one key: its value would need both
    {"type": "object", "patternProperties": {"a": {"type": "integer"}, "b": {"type": "string"}}},
    # where no other key is allowed, llama.cpp's `{}` refuses the pattern's keys: reported in the dialect
    {"type": "object", "patternProperties": {"^(?=a)": {"type": "integer"}}, "additionalProperties": False},
], ids=["declared name", "two patterns on one key", "unread pattern"])
def test_what_the_dialect_does_not_read_stays_reported(schema: dict[str, Any]) -> None:
    found = [item.keyword for item in convert_json_schema(json.dumps(schema), dialect="extended").unenforced]
    assert "patternProperties" in found


# the keys split by an automaton of the patterns (schema/key_automata.py)
SPLIT: Final = [
    # other keys beside a pattern that does not match every key, of another form than ^C*$ / ^C+$
    {"type": "object", "patternProperties": {"^[a-z]+[0-9]$": {"type": "integer"}}},
    # ... or beside declared names
    {"type": "object", "properties": {"ID": {}}, "patternProperties": {"^[a-z]+$": {"type": "integer"}}},
    # two patterns no key matches both of
    {"type": "object", "patternProperties": {"^a": {"type": "integer"}, "^b": {"type": "string"}},
     "additionalProperties": False},
]


@pytest.mark.parametrize("schema", SPLIT, ids=["complement", "complement beside names", "two patterns"])
@pytest.mark.parametrize("text", ['{}', '{"ab1":1}', '{"ab1":"x"}', '{"ab":1}', '{"ab":"x"}', '{"ID":"x"}',
                                  '{"ID":1,"b":"y"}', '{"b":1}', '{"c":null}', '{"a":1,"b":"x"}'])
def test_several_patterns_and_complements_split_the_keys(schema: dict[str, Any], text: str) -> None:
    assert convert_json_schema(json.dumps(schema), dialect="extended").unenforced == ()
    assert takes(schema, text) == valid(schema, text), text


PATTERN_AND_LENGTH: Final = {"type": "object",
                              "properties": {"a": {"type": "string", "pattern": "^x+$", "maxLength": 3}}}


@pytest.mark.parametrize("schema", [*SPLIT, CLOSED, BESIDE, NARROW_BESIDE, PATTERN_AND_LENGTH],
                         ids=["complement", "complement beside names", "two patterns", "closed", "beside",
                              "narrow beside", "pattern and length"])
def test_the_report_reads_what_the_conversion_read(schema: dict[str, Any],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # the report takes the conversion's readings of patterns and patternProperties (extended.Readings):
    # the same findings as reading them afresh, and each object's key automaton built once
    from constraintd.engine.schema import key_automata
    from constraintd.engine.schema.json_text import parse_json
    from constraintd.engine.schema.nodes import WorkLimit, schema_from_json
    from constraintd.engine.schema.report import unenforced_keywords

    built: list[tuple[str, ...]] = []
    original = key_automata.KeyAutomaton.__init__

    def counted(self: key_automata.KeyAutomaton, patterns: Any, names: Any) -> None:
        built.append(tuple(patterns))
        original(self, patterns, names)

    monkeypatch.setattr(key_automata.KeyAutomaton, "__init__", counted)
    conversion = convert_json_schema(json.dumps(schema), dialect="extended")
    assert len(built) == len(set(built))  # one object each here: none built twice
    document = schema_from_json(parse_json(json.dumps(schema)), WorkLimit(max_depth=128, deadline=1e18),
                                patterns=True)
    assert unenforced_keywords(document, {}, dialect="extended") == conversion.unenforced
