"""JSON schema to GBNF, against llama.cpp's own test cases, its converter running beside us, and our limits.

- llama.cpp's cases are read from the reference's `tests/test-json-schema-to-grammar.cpp` and compared as
  that test compares them (tests/schema_oracle/cases.py).
- The oracle tests run llama.cpp's converter itself (tests/schema_oracle/harness.cpp, built once per
  machine) on llama.cpp's cases, on every schema of the MaskBench sample and on generated schemas (200
  examples), and record how many answers were identical (`oracle_report`).
- Every grammar we produce for those corpora parses in our GBNF engine.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from constraintd.engine.grammar.checks import check_grammar
from constraintd.engine.grammar.gbnf import parse_gbnf
from constraintd.engine.schema import convert as json_schema
from constraintd.engine.schema.convert import (
    MAX_SCHEMA_DEPTH,
    SchemaConversion,
    convert_json_schema,
    json_schema_to_gbnf,
)
from constraintd.engine.schema.json_text import dump_json, parse_json
from constraintd.errors import GrammarError, SchemaError
from tests import reference
from tests.conftest import OracleReport
from tests.oracle import LlamaGrammar, LlamaVocab
from tests.schema_oracle.build import harness_binary
from tests.schema_oracle.cases import LlamaCase, read_cases, trim
from tests.schema_oracle.compare import EXPECTED_VERDICTS, compare_conversion
from tests.schema_oracle.strategies import schema_documents

LLAMA_CASES = read_cases(reference.require(reference.llama_cpp_dir()))
LLAMA_CASE_COUNT = 81  # test({...}) initializers in the pinned llama.cpp's test file, 3 of them failures
MASKBENCH = sorted((Path(__file__).parents[2] / "vectors" / "maskbench-sample").glob("*.json"))
FAILED = "JSON schema conversion failed:\n"


@pytest.fixture(scope="session")
def schema_oracle(llama_cpp_dir: Path) -> Path:
    """llama.cpp's converter, compiled from the reference tree on first use."""
    return harness_binary(llama_cpp_dir)


def maskbench_schema(path: Path) -> str:
    """The `schema` of a MaskBench file, as JSON text (key order and numbers as in the file)."""
    document = parse_json(path.read_text())
    assert isinstance(document, dict)
    return dump_json(document["schema"])


def assert_parses(grammar: str) -> None:
    check_grammar(parse_gbnf(grammar))


def test_every_case_of_llamas_test_is_read() -> None:
    assert len(LLAMA_CASES) == LLAMA_CASE_COUNT
    assert sum(not case.success for case in LLAMA_CASES) == 3
    assert len({case.name for case in LLAMA_CASES}) == LLAMA_CASE_COUNT


@pytest.mark.parametrize("case", LLAMA_CASES, ids=[case.name for case in LLAMA_CASES])
def test_llama_case(case: LlamaCase) -> None:
    if not case.success:
        with pytest.raises(SchemaError, match=r"^JSON schema conversion failed:\n"):
            convert_json_schema(case.schema)
        return
    conversion = convert_json_schema(case.schema)
    assert trim(conversion.grammar) == trim(case.grammar)
    assert_parses(conversion.grammar)


# Grammars llama.cpp's converter writes and llama.cpp's own GBNF parser then refuses (the oracle test below
# shows that it does): stem -> what the parser says.
UNPARSEABLE_IN_LLAMA = {
    # the pattern holds "\u0000"; a grammar is read as a C string, so it ends inside a character class
    "Github_easy---o27354": "unexpected end of input",
    # an additionalProperties key rule over many property names: too many repeated rules
    "JsonSchemaStore---clang-format": "exceeds sane defaults",
}


@pytest.mark.parametrize("path", MASKBENCH, ids=[path.stem for path in MASKBENCH])
def test_maskbench_grammar_parses_in_the_engine(path: Path) -> None:
    try:
        grammar = json_schema_to_gbnf(maskbench_schema(path))
    except SchemaError:
        return  # a refusal is compared with llama.cpp's in the oracle test
    if path.stem in UNPARSEABLE_IN_LLAMA:
        with pytest.raises(GrammarError, match=UNPARSEABLE_IN_LLAMA[path.stem]):
            assert_parses(grammar)
    else:
        assert_parses(grammar)


def engine_parses(grammar: str) -> bool:
    try:
        assert_parses(grammar)
    except GrammarError:
        return False
    return True


@pytest.mark.oracle
def test_maskbench_grammars_parse_exactly_where_llama_cpp_parses_them(oracle_report: OracleReport) -> None:
    grammars = {}
    for path in MASKBENCH:
        try:
            grammars[path.stem] = json_schema_to_gbnf(maskbench_schema(path))
        except SchemaError:
            continue
    with LlamaVocab(reference.require(reference.vocab_path("llama-spm"))) as vocab:
        theirs = {}
        for stem, grammar in grammars.items():
            sampler = LlamaGrammar.create(vocab, grammar)
            theirs[stem] = sampler is not None
            if sampler is not None:
                sampler.close()
    ours = {stem: engine_parses(grammar) for stem, grammar in grammars.items()}
    same = sum(ours[stem] == theirs[stem] for stem in grammars)
    oracle_report.add("schema grammar parses", "maskbench-sample", identical=same, total=len(grammars))
    assert ours == theirs
    assert {stem for stem, ok in theirs.items() if not ok} == set(UNPARSEABLE_IN_LLAMA)


def test_maskbench_sample_is_all_there() -> None:
    assert len(MASKBENCH) == 264


@pytest.mark.oracle
def test_llama_cases_are_byte_identical_to_llama_cpp(
    schema_oracle: Path, oracle_report: OracleReport
) -> None:
    verdicts = {case.name: compare_conversion(schema_oracle, case.schema) for case in LLAMA_CASES}
    identical = sum(verdict.verdict == "identical" for verdict in verdicts.values())
    oracle_report.add("schema grammars", "llama.cpp test cases", identical=identical, total=len(verdicts))
    assert {name: v.detail for name, v in verdicts.items() if v.verdict != "identical"} == {}


@pytest.mark.oracle
@pytest.mark.parametrize("path", MASKBENCH, ids=[path.stem for path in MASKBENCH])
def test_maskbench_schema_matches_llama_cpp(
    path: Path, schema_oracle: Path, oracle_report: OracleReport
) -> None:
    verdict = compare_conversion(schema_oracle, maskbench_schema(path))
    identical = int(verdict.verdict == "identical")
    oracle_report.add("schema grammars", "maskbench-sample", identical=identical, total=1)
    assert verdict.verdict == "identical", verdict.detail


@pytest.mark.oracle
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schema_documents())
def test_generated_schema_matches_llama_cpp(
    schema: dict[str, object], schema_oracle: Path, oracle_report: OracleReport
) -> None:
    verdict = compare_conversion(schema_oracle, json.dumps(schema, ensure_ascii=False))
    oracle_report.add("schema grammars", "hypothesis", identical=int(verdict.verdict == "identical"), total=1)
    # a drawn pattern can split a multi-byte character (`^é*$`): llama.cpp writes a grammar that is not
    # UTF-8, and the refusal is the design (EDGE_SCHEMAS' "split multi-byte pattern character")
    assert verdict.verdict in EXPECTED_VERDICTS, verdict.detail


# Schemas at llama.cpp's corners, each compared with llama.cpp itself, and what we answer.
EDGE_SCHEMAS = {
    "numbers printed as nlohmann prints them": (
        '{"enum": [2.0, 1e16, 18446744073709551616, -0, -0.0, 1.5e-7, {"b": 1, "a": 2, "b": 3}]}',
        "identical"),
    "big and fractional integer bounds": ('{"type": "integer", "minimum": -2.5, "exclusiveMaximum": 1e300}',
                                          "identical"),
    "no bound left after wrapping": ('{"type": "integer", "maximum": -9223372036854775808}', "identical"),
    "count above INT_MAX wraps": ('{"type": "array", "minItems": 4294967296}', "identical"),
    "property names colliding with rules": (
        '{"properties": {"": {}, "root": {"type": "integer"}, "a b": {"const": 1}, "a-b": {"const": 2}}}',
        "identical"),
    "additional keys excluding quotes and brackets": (
        '{"properties": {"k]": {}, "x\\"y": {}, "é": {}}, "additionalProperties": {"type": "null"}}',
        "identical"),
    "split multi-byte pattern character": ('{"type": "string", "pattern": "^é+$"}', "utf8-refused"),
    "ref cycle inside allOf": ('{"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"$ref": "#/$defs/a"}}}',
                               "crash-refused"),
    "not JSON": ('{"type": "string",}', "identical"),
    # llama.cpp recurses on the C stack for each level and crashes
    "items nested 100000 deep": ('{"items": ' * 100_000 + "{}" + "}" * 100_000, "crash-refused"),
    "type lists nested 100000 deep": ('{"type": ' + "[" * 100_000 + '"null"' + "]" * 100_000 + "}",
                                      "crash-refused"),
}


@pytest.mark.oracle
@pytest.mark.parametrize(("schema", "expected"), EDGE_SCHEMAS.values(), ids=EDGE_SCHEMAS.keys())
def test_edge_schema_compared_with_llama_cpp(
    schema: str, expected: str, schema_oracle: Path, oracle_report: OracleReport
) -> None:
    verdict = compare_conversion(schema_oracle, schema)
    # where llama.cpp crashes or writes broken text, our refusal is the answer we owe: counted apart
    what = "schema grammars" if expected == "identical" else "schema refused, llama.cpp not"
    oracle_report.add(what, "edge cases", identical=int(verdict.verdict == expected), total=1)
    assert verdict.verdict in EXPECTED_VERDICTS
    assert verdict.verdict == expected, verdict.detail


def test_numbers_and_key_order_reach_the_grammar_as_llama_reads_them() -> None:
    grammar = json_schema_to_gbnf('{"enum": [2.0, 1e16, 18446744073709551616, {"b": 1, "a": 2, "b": 3}]}')
    expected = 'root ::= ("2.0" | "1e+16" | "1.8446744073709552e+19" | "{\\"b\\":3,\\"a\\":2}")'
    assert grammar.splitlines()[0] == expected


REFUSALS = {
    "bad type deep inside": (
        '{"properties": {"a": {"items": {"type": 5}}}}',
        "JSON schema error at #/properties/a/items: type must be a string or an array of strings",
        "#/properties/a/items"),
    "pointer escapes a slash": (
        '{"properties": {"a/b": {"type": "kaboom"}}}',
        "JSON schema error at #/properties/a/b: unrecognized type kaboom", "#/properties/a~1b"),
    "inside a $ref target": (
        '{"$ref": "#/$defs/x", "$defs": {"x": {"minItems": -1, "items": {}}}}',
        "JSON schema error at #/$defs/x: minItems must be a non-negative integer", "#/$defs/x"),
    "invalid pattern in a property": (
        '{"properties": {"p": {"type": "string", "pattern": "^(a$"}}}',
        "Invalid pattern ^(a$: unbalanced parentheses", "#/properties/p"),
    "integer without any bound": (
        '{"properties": {"n": {"type": "integer", "maximum": -9223372036854775808}}}',
        "At least one of min_value or max_value must be set", "#/properties/n"),
    "unresolvable $ref": (
        '{"items": {"$ref": "#/$defs/none"}}',
        "JSON schema error at #/items: cannot resolve $ref #/$defs/none, $defs not found", "#/items"),
}


@pytest.mark.parametrize(("schema", "message", "pointer"), REFUSALS.values(), ids=REFUSALS.keys())
def test_refusal_has_llamas_message_and_the_pointer_of_the_node(
    schema: str, message: str, pointer: str
) -> None:
    with pytest.raises(SchemaError) as caught:
        convert_json_schema(schema)
    assert caught.value.reason == FAILED + message
    assert caught.value.pointer == pointer


def test_untranslatable_pattern_becomes_any_string_with_llamas_warning() -> None:
    conversion = convert_json_schema('{"type": "string", "pattern": "^\\\\w$"}')
    warning = "pattern ^\\w$ is not supported (unsupported escape: \\w), accepting any string"
    assert conversion.warnings == (warning,)
    assert "root ::= string\n" in conversion.grammar


def test_conversion_is_a_frozen_value() -> None:
    conversion = convert_json_schema('{"type": "boolean"}')
    grammar = 'root ::= ("true" | "false")\nspace ::= | " " | "\\n"{1,2} [ \\t]{0,20}\n'
    assert conversion == SchemaConversion(grammar, ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        conversion.grammar = ""  # type: ignore[misc]
    assert json_schema_to_gbnf('{"type": "boolean"}') == conversion.grammar


@pytest.mark.parametrize(
    "text",
    ["", "{", '{"type": "string",}', "NaN", '{"minimum": 1e400}', '{"const": "\\ud800"}', "{} {}"],
    ids=["empty", "unclosed", "trailing-comma", "nan", "overflow", "lone-surrogate", "two-values"],
)
def test_text_that_is_not_json_is_refused(text: str) -> None:
    with pytest.raises(SchemaError, match=r"^invalid JSON") as caught:
        convert_json_schema(text)
    assert caught.value.pointer == "#"


def nested_items(depth: int) -> str:
    return '{"items": ' * depth + "{}" + "}" * depth


def ref_chain(length: int) -> str:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(length)}
    defs[f"d{length}"] = {"type": "string"}
    return json.dumps({"$ref": "#/$defs/d0", "$defs": defs})


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000 + "]" * 100_000, nested_items(MAX_SCHEMA_DEPTH + 1), ref_chain(3 * MAX_SCHEMA_DEPTH)],
    ids=["json-nesting", "schema-nesting", "ref-chain"],
)
def test_deep_input_is_refused_not_a_recursion_error(text: str) -> None:
    with pytest.raises(SchemaError, match="deeper than"):
        convert_json_schema(text)


def test_nesting_up_to_the_limit_converts() -> None:
    assert "root ::=" in json_schema_to_gbnf(nested_items(MAX_SCHEMA_DEPTH - 1))


def test_exponential_schema_stops_at_the_time_limit() -> None:
    # every level builds its properties twice (a type list of two objects): 2**40 nodes
    schema: dict[str, object] = {"type": "string"}
    for _ in range(40):
        schema = {"type": ["object", "object"], "properties": {"a": schema}}
    with pytest.raises(SchemaError, match="time limit"):
        convert_json_schema(json.dumps(schema), time_limit=0.2)


def test_grammar_size_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    schema = json.dumps({"enum": [f"value number {i}" for i in range(200)]})
    assert json_schema_to_gbnf(schema)
    monkeypatch.setattr(json_schema, "MAX_GRAMMAR_CHARS", 1000)
    with pytest.raises(SchemaError, match="grows past 1000 characters"):
        convert_json_schema(schema)


def test_ref_cycle_inside_allof_is_refused() -> None:
    with pytest.raises(SchemaError, match="cycle") as caught:
        convert_json_schema('{"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"$ref": "#/$defs/a"}}}')
    assert caught.value.pointer == "#"


def test_pattern_whose_grammar_would_not_be_utf8_is_refused() -> None:
    with pytest.raises(SchemaError, match="not valid UTF-8") as caught:
        convert_json_schema('{"properties": {"p": {"type": "string", "pattern": "^aé*$"}}}')
    assert caught.value.pointer == "#/properties/p"
    # the same character not followed by a quantifier stays whole
    assert 'root ::= "\\"" ("aé") "\\""' in json_schema_to_gbnf('{"type": "string", "pattern": "^aé$"}')
