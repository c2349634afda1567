"""The keyword table and the report of a conversion (constraintd/engine/schema/keywords.py, report.py).

Every keyword of JSON Schema 2020-12 (the seven vocabularies, read from the metaschemas themselves) and the
older drafts' keywords of the table, used in a schema, is either enforced by the grammar or named by the
report with its pointer. Each case says which, and proves it: an enforced keyword's grammar refuses a
document that breaks that keyword (and takes one that keeps it), matched byte by byte by the engine's own
matcher; a reported keyword is named at its pointer, and strict conversion refuses the schema there. A
validator of the schema's draft (`jsonschema`) confirms each case's documents are what they claim.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

import pytest

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.schema.convert import convert_json_schema
from constraintd.engine.schema.keywords import KEYWORDS, Enforcement, keyword_of
from constraintd.errors import SchemaError

# one token per byte: the grammar is matched on the document's raw bytes
BYTES: Final = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])
_ABSENT: Final = object()
DRAFT7: Final = "http://json-schema.org/draft-07/schema#"
DRAFT2019: Final = "https://json-schema.org/draft/2019-09/schema"
VOCABULARIES: Final = ("core", "applicator", "unevaluated", "validation", "format-annotation", "content",
                       "meta-data")
UUID: Final = "123e4567-e89b-12d3-a456-426614174000"


def accepts(gbnf: str, document: object) -> bool:
    matcher = Matcher(Grammar.from_gbnf(gbnf, BYTES))
    text = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    return matcher.accept_bytes(text.encode()) and matcher.is_complete()


@dataclass(frozen=True)
class Case:
    """A schema using `keyword`; `pointer` None: the grammar enforces it (refuses `invalid`, takes `valid`),
    else the report names it there. `invalid` breaks that keyword and nothing else of the schema."""

    id: str
    keyword: str
    schema: dict[str, object]
    invalid: object
    valid: object = _ABSENT
    pointer: str | None = None


CASES: Final = [
    # core
    Case("$ref", "$ref", {"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a"}, "x", 1),
    Case("beside $ref", "minimum",
         {"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a", "minimum": 3}, 1, pointer="#/minimum"),
    Case("$dynamicRef", "$dynamicRef",
         {"$defs": {"n": {"$dynamicAnchor": "node", "type": "integer"}}, "$dynamicRef": "#node"}, "x",
         pointer="#/$dynamicRef"),
    # applicator
    Case("prefixItems", "prefixItems", {"prefixItems": [{"type": "integer"}]}, ["x"], [1]),
    Case("prefixItems beside items", "prefixItems",
         {"prefixItems": [{"type": "integer"}], "items": {"type": "string"}}, ["a"], pointer="#/prefixItems"),
    Case("items", "items", {"type": "array", "items": {"type": "integer"}}, ["x"], [1]),
    Case("contains", "contains", {"type": "array", "contains": {"type": "integer"}}, ["x"],
         pointer="#/contains"),
    Case("additionalProperties", "additionalProperties",
         {"type": "object", "additionalProperties": {"type": "integer"}}, {"b": "x"}, {"b": 1}),
    Case("additionalProperties beside properties", "additionalProperties",
         {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True},
         {"a": "x"}, pointer="#/additionalProperties"),
    Case("properties", "properties", {"type": "object", "properties": {"a": {"type": "integer"}}}, {"a": "x"},
         {"a": 1}),
    Case("properties beside anyOf", "properties",
         {"anyOf": [{"type": "object"}], "properties": {"a": {"type": "integer"}}}, {"a": "x"},
         pointer="#/properties"),
    Case("patternProperties", "patternProperties",
         {"type": "object", "patternProperties": {"^a": {"type": "integer"}}}, {"a": "x"},
         pointer="#/patternProperties"),
    Case("dependentSchemas", "dependentSchemas",
         {"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}}, {"a": 1},
         pointer="#/dependentSchemas"),
    Case("propertyNames", "propertyNames", {"type": "object", "propertyNames": {"maxLength": 1}}, {"ab": 1},
         pointer="#/propertyNames"),
    Case("if", "if", {"if": {"type": "integer"}, "then": {"minimum": 0}}, -1, pointer="#/if"),
    Case("then", "then", {"if": {"type": "integer"}, "then": {"minimum": 0}}, -1, pointer="#/then"),
    Case("else", "else", {"if": {"type": "integer"}, "else": {"type": "string"}}, True, pointer="#/else"),
    Case("allOf", "allOf",
         {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}]},
         {"a": "x"}, {"a": 1}),
    Case("allOf part dropped", "allOf", {"allOf": [{"properties": {"a": {"type": "integer"}}},
                                                   {"type": "string"}]}, {"a": 1}, pointer="#/allOf/1"),
    Case("anyOf", "anyOf", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "x", None),
    Case("oneOf disjoint", "oneOf", {"oneOf": [{"type": "integer"}, {"type": "string"}]}, None, 1),
    Case("oneOf tagged", "oneOf", {"oneOf": [
        {"type": "object", "properties": {"t": {"const": "a"}, "v": {"type": "integer"}}, "required": ["t"]},
        {"type": "object", "properties": {"t": {"const": "b"}, "v": {"type": "string"}}, "required": ["t"]},
    ]}, {"t": "a", "v": "x"}, {"t": "a", "v": 1}),
    Case("oneOf of objects another does not allow", "oneOf", {"oneOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
         "additionalProperties": False},
        {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"],
         "additionalProperties": False},
    ]}, {"a": 1, "b": 1}, {"b": 1}),
    Case("oneOf overlapping", "oneOf", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1,
         pointer="#/oneOf"),
    Case("not", "not", {"not": {"type": "integer"}}, 1, pointer="#/not"),
    # unevaluated
    Case("unevaluatedItems", "unevaluatedItems", {"type": "array", "unevaluatedItems": {"type": "integer"}},
         ["x"], pointer="#/unevaluatedItems"),
    Case("unevaluatedProperties", "unevaluatedProperties",
         {"type": "object", "unevaluatedProperties": {"type": "integer"}}, {"a": "x"},
         pointer="#/unevaluatedProperties"),
    # validation
    Case("type", "type", {"type": "integer"}, "x", 1),
    Case("type list", "type", {"type": ["integer", "null"]}, "x", None),
    Case("type beside enum", "type", {"type": "string", "enum": ["a", 1]}, 1, pointer="#/type"),
    Case("const", "const", {"const": "a"}, "b", "a"),
    Case("enum", "enum", {"enum": [1, 2]}, 3, 1),
    Case("multipleOf", "multipleOf", {"type": "integer", "multipleOf": 2}, 3, pointer="#/multipleOf"),
    Case("maximum", "maximum", {"type": "integer", "maximum": 3}, 4, 3),
    Case("maximum on a number", "maximum", {"type": "number", "maximum": 3}, 4, pointer="#/maximum"),
    Case("exclusiveMaximum", "exclusiveMaximum", {"type": "integer", "exclusiveMaximum": 3}, 3, 2),
    Case("exclusiveMaximum on a number", "exclusiveMaximum", {"type": "number", "exclusiveMaximum": 3}, 3,
         pointer="#/exclusiveMaximum"),
    Case("minimum", "minimum", {"type": "integer", "minimum": 0}, -1, 0),
    Case("minimum on a number", "minimum",
         {"type": "object", "properties": {"age": {"type": "number", "minimum": 0}}}, {"age": -1},
         pointer="#/properties/age/minimum"),
    Case("minimum beyond int64", "minimum", {"type": "integer", "minimum": 1e300}, 1, pointer="#/minimum"),
    Case("exclusiveMinimum", "exclusiveMinimum", {"type": "integer", "exclusiveMinimum": 3}, 3, 4),
    Case("exclusiveMinimum beside minimum", "exclusiveMinimum",
         {"type": "integer", "minimum": 0, "exclusiveMinimum": 0}, 0, pointer="#/exclusiveMinimum"),
    Case("maxLength", "maxLength", {"type": "string", "maxLength": 2}, "abc", "ab"),
    Case("maxLength beside pattern", "maxLength", {"type": "string", "pattern": "^a+$", "maxLength": 2},
         "aaa", pointer="#/maxLength"),
    Case("minLength", "minLength", {"type": "string", "minLength": 1}, "", "a"),
    Case("minLength beside format", "minLength", {"type": "string", "format": "uuid", "minLength": 40}, UUID,
         pointer="#/minLength"),
    Case("pattern", "pattern", {"type": "string", "pattern": "^[a-z]+$"}, "A", "a"),
    Case("pattern not translated", "pattern", {"type": "string", "pattern": "^\\d+$"}, "a",
         pointer="#/pattern"),
    Case("pattern of any character", "pattern", {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "^.*$"}, "b": {"type": "integer"}}}, {"a": "x", "b": "y"},
         pointer="#/properties/a/pattern"),
    Case("maxItems", "maxItems", {"type": "array", "maxItems": 1}, [1, 2], [1]),
    Case("maxItems on a tuple", "maxItems", {"prefixItems": [{}, {}], "maxItems": 1}, [1, 2],
         pointer="#/maxItems"),
    Case("minItems", "minItems", {"type": "array", "minItems": 1}, [], [1]),
    Case("minItems on a tuple", "minItems", {"prefixItems": [{}], "minItems": 2}, [1], pointer="#/minItems"),
    Case("uniqueItems", "uniqueItems", {"type": "array", "uniqueItems": True}, [1, 1],
         pointer="#/uniqueItems"),
    Case("maxContains", "maxContains",
         {"type": "array", "contains": {"type": "integer"}, "maxContains": 1}, [1, 2],
         pointer="#/maxContains"),
    Case("minContains", "minContains",
         {"type": "array", "contains": {"type": "integer"}, "minContains": 2}, [1], pointer="#/minContains"),
    Case("maxProperties", "maxProperties", {"type": "object", "maxProperties": 1}, {"a": 1, "b": 2},
         pointer="#/maxProperties"),
    Case("minProperties", "minProperties", {"type": "object", "minProperties": 1}, {},
         pointer="#/minProperties"),
    Case("required", "required", {"type": "object", "properties": {"a": {}}, "required": ["a"]}, {},
         {"a": 1}),
    Case("required undeclared", "required", {"type": "object", "required": ["a"]}, {}, pointer="#/required"),
    Case("dependentRequired", "dependentRequired", {"type": "object", "dependentRequired": {"a": ["b"]}},
         {"a": 1}, pointer="#/dependentRequired"),
    # format-annotation
    Case("format uuid", "format", {"type": "string", "format": "uuid"}, "x", UUID),
    Case("format time", "format", {"type": "string", "format": "time"}, "25:00:00Z", "12:00:00Z"),
    Case("format date", "format", {"type": "string", "format": "date"}, "2020-02-31", pointer="#/format"),
    Case("format email", "format", {"type": "string", "format": "email"}, "x", pointer="#/format"),
    # older drafts
    Case("dependencies", "dependencies", {"$schema": DRAFT7, "type": "object", "dependencies": {"a": ["b"]}},
         {"a": 1}, pointer="#/dependencies"),
    Case("additionalItems", "additionalItems",
         {"$schema": DRAFT7, "items": [{}], "additionalItems": {"type": "integer"}}, [1, "x"], [1]),
    Case("$recursiveRef", "$recursiveRef", {"$schema": DRAFT2019, "$recursiveAnchor": True, "type": "object",
                                            "properties": {"a": {"$recursiveRef": "#"}}}, {"a": 1},
         pointer="#/properties/a/$recursiveRef"),
]

ANNOTATIONS: Final = {
    "$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "https://example.com/s",
    "$anchor": "here", "$dynamicAnchor": "node", "$vocabulary": {}, "$comment": "c", "$defs": {"a": {}},
    "contentEncoding": "base64", "contentMediaType": "text/plain", "contentSchema": {"type": "integer"},
    "title": "t", "description": "d", "default": 5, "deprecated": True, "readOnly": True, "writeOnly": False,
    "examples": [5], "definitions": {"a": {}}, "id": "s", "$recursiveAnchor": False,
}
"""Every annotation of the table, with a value: these restrict nothing, so the report never names them."""


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_keyword_is_enforced_or_reported(case: Case) -> None:
    text = json.dumps(case.schema)
    conversion = convert_json_schema(text)
    named = {(item.pointer, item.keyword) for item in conversion.unenforced}
    assert all(item.reason for item in conversion.unenforced)
    if case.pointer is not None:
        assert (case.pointer, case.keyword) in named, conversion.unenforced
        with pytest.raises(SchemaError) as refused:
            convert_json_schema(text, strict=True)
        assert refused.value.pointer == conversion.unenforced[0].pointer
        assert refused.value.reason.startswith("strict: ")
        return
    assert conversion.unenforced == ()
    assert not accepts(conversion.grammar, case.invalid)
    if case.valid is not _ABSENT:
        assert accepts(conversion.grammar, case.valid)
    assert convert_json_schema(text, strict=True) == conversion


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_the_cases_documents_are_what_they_claim(case: Case) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    default = jsonschema.Draft202012Validator
    validator_class = jsonschema.validators.validator_for(case.schema, default=default)
    checker = validator_class.FORMAT_CHECKER
    if "format" in case.schema and case.schema["format"] not in checker.checkers:
        pytest.skip(f"this jsonschema cannot check format {case.schema['format']}")
    validator = validator_class(case.schema, format_checker=checker)
    assert not validator.is_valid(case.invalid)
    if case.valid is not _ABSENT:
        assert validator.is_valid(case.valid)


def test_every_keyword_that_restricts_has_a_case() -> None:
    annotation = Enforcement.ANNOTATION
    restricting = {name for name, entry in KEYWORDS.items() if entry.enforcement is not annotation}
    assert restricting == {case.keyword for case in CASES}
    assert set(ANNOTATIONS) == {name for name, entry in KEYWORDS.items()
                                if entry.enforcement is Enforcement.ANNOTATION}


def test_the_table_holds_every_keyword_of_2020_12() -> None:
    specifications = pytest.importorskip("jsonschema_specifications")
    for vocabulary in VOCABULARIES:
        meta = specifications.REGISTRY.contents(f"https://json-schema.org/draft/2020-12/meta/{vocabulary}")
        names = set(meta["properties"])
        assert names, vocabulary
        for name in names:
            assert name in KEYWORDS, name
            # `definitions` and `dependencies` sit in the 2020-12 metaschemas for older schemas' sake
            assert KEYWORDS[name].vocabulary in (vocabulary, "draft-07"), name


@pytest.mark.parametrize("keyword", sorted(ANNOTATIONS))
def test_an_annotation_changes_neither_grammar_nor_report(keyword: str) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}
    plain = convert_json_schema(json.dumps(schema))
    annotated = convert_json_schema(json.dumps({**schema, keyword: ANNOTATIONS[keyword]}))
    assert annotated.grammar == plain.grammar
    assert annotated.unenforced == plain.unenforced == ()


def test_a_keyword_the_kind_does_not_read_says_what_the_schema_converts_as() -> None:
    conversion = convert_json_schema('{"type": "integer", "allOf": [{"minimum": 1}]}')
    assert conversion.report == ("#/allOf: allOf: ignored: the schema converts as an integer",)


def test_an_unknown_keyword_is_an_annotation() -> None:
    assert keyword_of("x-vendor").enforcement is Enforcement.ANNOTATION
    assert convert_json_schema('{"type": "integer", "x-vendor": {"not": {}}}').unenforced == ()


# 40 levels, each an anyOf of the next level twice: the types of the top are read once per level
REF_LADDER: Final = {
    "$ref": "#/$defs/d0", "minLength": 1,
    "$defs": {**{f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(40)},
              "d40": {"type": "integer"}},
}


def tagged(tags: list[object]) -> dict[str, object]:
    """A oneOf of objects told apart by the value of their required property `kind`."""
    return {"oneOf": [{"type": "object", "properties": {"kind": {"enum": [tag]}, "value": {"type": "string"}},
                       "required": ["kind"]} for tag in tags]}


@pytest.mark.parametrize(
    ("schema", "pointers"),
    [
        ({"type": "string", "minimum": 3, "items": {}, "required": ["a"]}, []),
        ({"type": ["string", "null"], "minLength": 1}, []),
        ({"type": ["number", "string"], "minimum": 1}, ["#/minimum"]),
        ({"enum": [1, 2], "minLength": 3}, []),
        ({"enum": ["abc"], "minLength": 3}, ["#/minLength"]),
        ({"type": "object", "properties": {"a": {}}, "patternProperties": {"^b": {}}},
         ["#/patternProperties"]),
        ({"type": "object", "additionalProperties": False, "patternProperties": {"^b": {}}}, []),
        ({"type": "array", "items": {}, "unevaluatedItems": False}, []),
        ({"type": "array", "uniqueItems": False}, []),
        ({"type": "integer", "multipleOf": 1}, []),
        ({"type": "integer", "minimum": 5, "exclusiveMinimum": 1}, []),
        ({"type": "integer", "minimum": 5, "exclusiveMinimum": True}, ["#/exclusiveMinimum"]),
        ({"prefixItems": [{}, {}], "minItems": 1, "maxItems": 2}, []),
        ({"type": "object", "properties": {"a": {}}, "required": ["a"], "minProperties": 1}, []),
        ({"type": "object", "properties": {"a": {}}, "maxProperties": 1}, []),
        ({"$ref": "#/$defs/s", "$defs": {"s": {"type": "string"}}, "minimum": 1}, []),
        ({"anyOf": [{"type": "string"}, {"type": "null"}], "type": ["string", "null"]}, []),
        ({"oneOf": [{"const": 1}, {"enum": [2, 3]}]}, []),
        ({"oneOf": [{"const": 1}, {"enum": [1, 3]}]}, ["#/oneOf"]),
        ({"type": "string", "pattern": "^[a-z.\\-]+$"}, []),
        ({"type": "string", "pattern": "^[^a]+$"}, ["#/pattern"]),
        ({"type": "string", "pattern": "^[ -~]+$"}, ["#/pattern"]),
        ({"allOf": [{"anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}]}, ["#/allOf/0/anyOf"]),
        ({"allOf": [{"enum": [1, 2]}, {"enum": [2, 3]}]}, []),
        ({"allOf": [{"enum": [1, 2]}, {"type": "object"}]}, ["#/allOf/0"]),
        ({"properties": {"a/b~": {"not": {}}}}, ["#/properties/a~1b~0/not"]),
        ({"oneOf": [{"type": "integer"}, {"minLength": 3}]}, ["#/oneOf"]),
        ({"oneOf": [{"const": 1}, {"const": 1.0}]}, ["#/oneOf"]),
        ({"oneOf": [{"const": {"a": 1, "b": 2}}, {"enum": [{"b": 2, "a": 1}]}]}, ["#/oneOf"]),
        ({"$defs": {"t": {"anyOf": [{"type": "null"},
                                    {"type": "object", "properties": {"c": {"$ref": "#/$defs/t"}}}]}},
          "$ref": "#/$defs/t", "minimum": 1}, []),
        (REF_LADDER, []),
        ({"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"a": {"type": "string"}}}]},
         ["#/allOf/0/properties/a"]),
        ({"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"a": {"type": "integer"}}}]},
         []),
        ({"if": {"type": "integer"}, "minimum": 0, "type": "integer"}, []),
        ({"then": {"type": "integer"}, "else": {"type": "string"}}, []),
        ({"type": "integer", "multipleOf": 0.1}, []),
        ({"type": "integer", "multipleOf": 0.3}, ["#/multipleOf"]),
        ({"type": "array", "maxItems": 1, "uniqueItems": True}, []),
        (tagged(["a", "b", "c"]), []),
        (tagged(["a", "b", "a"]), ["#/oneOf"]),
        (tagged(list(range(500))), []),
        ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}, {"type": "null"}]},
                    "b": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "string"}]}},
          "oneOf": [{"$ref": "#/$defs/a"}, {"type": "integer"}]}, []),
        ({"type": "integer", "minimum": 10, "maximum": 2}, ["#/minimum"]),
        ({"type": "integer", "exclusiveMaximum": -(2**63)}, ["#/exclusiveMaximum"]),
        ({"type": "integer", "minimum": 2.5, "exclusiveMaximum": 7.5}, []),
        ({"type": "integer", "minimum": 100}, ["#/minimum"]),
        ({"type": "integer", "maximum": -1}, ["#/maximum"]),
        ({"type": "integer", "minimum": 123}, []),
        ({"type": "array", "minItems": 3, "maxItems": 1}, ["#/minItems"]),
        ({"type": "string", "minLength": 1, "maxLength": 0}, ["#/minLength"]),
        ({"type": "object", "properties": {"": {"type": "integer"}}}, ["#/properties/"]),
        ({"type": "object", "properties": {"a": {"properties": {"": {"type": "integer"}}}}}, []),
        ({"type": "object", "properties": {"*": {"type": "integer"}}}, ["#/properties/*"]),
    ],
    ids=["other-types-vacuous", "type-list", "type-list-number", "enum-other-type", "enum-same-type",
         "patternProperties-open", "patternProperties-closed-empty", "unevaluatedItems-items",
         "uniqueItems-false", "multipleOf-1", "exclusive-below-minimum", "draft4-boolean-exclusive",
         "tuple-counts-hold", "minProperties-by-required", "maxProperties-closed", "ref-sibling-other-type",
         "anyOf-type-holds", "oneOf-values-disjoint", "oneOf-values-overlap", "pattern-class-safe",
         "pattern-negated-class", "pattern-range-over-quote", "anyOf-inside-allOf", "allOf-enums",
         "allOf-enum-beside-object", "pointer-escapes", "oneOf-untyped-alternative", "oneOf-equal-numbers",
         "oneOf-equal-objects", "recursive-ref-types", "ref-ladder", "allOf-property-replaced",
         "allOf-property-repeated", "if-alone", "then-else-alone", "multipleOf-divides-one",
         "multipleOf-not-dividing-one", "uniqueItems-of-one", "tagged-union", "tagged-union-repeated-tag",
         "tagged-union-of-500", "oneOf-through-a-ref-cycle", "integer-bounds-crossed",
         "exclusive-bound-wraps", "fractional-bounds", "minimum-with-inner-zero", "negative-maximum-alone",
         "minimum-that-holds", "item-counts-crossed", "lengths-crossed", "empty-name-at-the-root",
         "empty-name-below", "star-name"],
)
def test_what_the_report_names(schema: dict[str, object], pointers: list[str]) -> None:
    conversion = convert_json_schema(json.dumps(schema))
    assert [item.pointer for item in conversion.unenforced] == pointers


def test_an_escaped_property_name_passes_as_another_key() -> None:
    # why additionalProperties beside properties is reported: `\u0061` is `a`, read as another key
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True}
    matcher = Matcher(Grammar.from_gbnf(convert_json_schema(json.dumps(schema)).grammar, BYTES))
    assert matcher.accept_bytes(b'{"\\u0061":"x"}') and matcher.is_complete()
