"""JSON read and printed as nlohmann::ordered_json does, compared with nlohmann itself in the oracle tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constraintd.engine.schema.json_text import (
    MAX_JSON_DEPTH,
    JsonValue,
    dump_json,
    dump_string,
    is_integer,
    parse_json,
    to_int32,
    to_int64,
)
from constraintd.errors import SchemaError
from tests.conftest import OracleReport
from tests.schema_oracle.build import harness_binary, run_harness
from tests.schema_oracle.strategies import json_values


@pytest.fixture(scope="session")
def schema_oracle(llama_cpp_dir: Path) -> Path:
    return harness_binary(llama_cpp_dir)


def test_repeated_key_keeps_its_first_place_and_its_last_value() -> None:
    value = parse_json('{"a": 1, "b": 2, "a": 3}')
    assert value == {"a": 3, "b": 2}
    assert isinstance(value, dict)
    assert list(value) == ["a", "b"]
    assert dump_json(value) == '{"a":3,"b":2}'


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", 2), ("2.0", 2.0), ("-0", 0), ("-0.0", -0.0), ("1E2", 100.0),
        ("18446744073709551615", 2**64 - 1), ("18446744073709551616", 1.8446744073709552e19),
        ("-9223372036854775808", -(2**63)), ("-9223372036854775809", -9.223372036854776e18),
    ],
    ids=["int", "float", "minus-zero-int", "minus-zero-float", "exponent", "uint64-max", "past-uint64",
         "int64-min", "past-int64-min"],
)
def test_integer_literals_in_range_stay_integers(text: str, value: JsonValue) -> None:
    parsed = parse_json(text)
    assert parsed == value
    assert type(parsed) is type(value)
    assert is_integer(parsed) is isinstance(value, int)


def test_long_integer_literal_becomes_a_float_or_overflows() -> None:
    assert parse_json("1" * 300) == float("1" * 300)
    with pytest.raises(SchemaError, match="number overflow"):
        parse_json("1" * 400)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("\x00\x1f\x7f\b\f\n\r\t/é\"\\", '"\\u0000\\u001f\x7f\\b\\f\\n\\r\\t/é\\"\\\\"'),
        ([None, True, False, [], {}], "[null,true,false,[],{}]"),
        ({"k": [1, 2.5, "x"]}, '{"k":[1,2.5,"x"]}'),
    ],
    ids=["escapes", "literals", "nested"],
)
def test_dump_is_compact_and_escapes_only_what_nlohmann_escapes(value: JsonValue, text: str) -> None:
    assert dump_json(value) == text
    if isinstance(value, str):
        assert dump_string(value) == text


def test_leading_byte_order_mark_is_skipped() -> None:
    assert parse_json('\ufeff{"a": 1}') == {"a": 1}


@pytest.mark.parametrize(
    "text",
    ["", " ", "{", "[1,]", '{"a" 1}', "NaN", "-Infinity", "01", "1.", ".5", "[1e400]", '"\\ud800"',
     '"\\udc00\\ud800"', '"a\tb"', "{} x", "'a'", "[\ufeff1]", "\ud800"],
    ids=["empty", "blank", "unclosed", "trailing-comma", "no-colon", "nan", "infinity", "leading-zero",
         "bare-dot", "dot-first", "overflow", "lone-high", "swapped-pair", "raw-tab", "extra",
         "single-quotes", "inner-bom", "raw-surrogate"],
)
def test_invalid_json_is_refused_with_a_schema_error(text: str) -> None:
    with pytest.raises(SchemaError, match=r"^invalid JSON") as caught:
        parse_json(text)
    assert caught.value.pointer == "#"


def test_nesting_limit() -> None:
    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    with pytest.raises(SchemaError, match="deeper than"):
        parse_json("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    # brackets inside strings are not nesting
    assert parse_json(json.dumps("[" * 10_000)) == "[" * 10_000


@pytest.mark.parametrize(
    ("value", "as_int32", "as_int64"),
    [(5, 5, 5), (2**31, -(2**31), 2**31), (2**32, 0, 2**32), (2**64 - 1, -1, -1), (-(2**63), 0, -(2**63))],
    ids=["small", "int32-overflow", "wraps-to-zero", "uint64-max", "int64-min"],
)
def test_narrowing_wraps_as_cpp_static_cast(value: int, as_int32: int, as_int64: int) -> None:
    assert to_int32(value) == as_int32
    assert to_int64(value) == as_int64


def dump_both(binary: Path, text: str) -> tuple[str, str]:
    answer = run_harness(binary, text.encode(), mode="dump")
    theirs = answer.out.decode() if answer.code == 0 else "<refused>"
    try:
        ours = dump_json(parse_json(text))
    except SchemaError:
        ours = "<refused>"
    return ours, theirs


ORACLE_TEXTS = [
    '{"a": 1, "b": {"c": 2, "a": 3}, "a": [4, {"a": 5, "a": 6}]}', '\ufeff[1, 2]', "[1e400]", '"\\ud800"',
    "[18446744073709551616, -9223372036854775809, 123456789012345678901234567890]", '[-0, -0.0, 1E-400]',
    '"\\u0000\\u001F\\u007f\\u00e9\\ud83d\\ude00"', "[01]", "[1,]", "NaN", '{"a":1}  ', "[\ufeff1]",
]


@pytest.mark.oracle
@pytest.mark.parametrize("text", ORACLE_TEXTS, ids=range(len(ORACLE_TEXTS)))
def test_same_value_as_nlohmann(text: str, schema_oracle: Path, oracle_report: OracleReport) -> None:
    ours, theirs = dump_both(schema_oracle, text)
    oracle_report.add("JSON values", "edge texts", identical=int(ours == theirs), total=1)
    assert ours == theirs


@pytest.mark.oracle
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values, indent=st.sampled_from([None, 1, 2]))
def test_generated_value_reads_and_prints_as_nlohmann(
    value: object, indent: int | None, schema_oracle: Path, oracle_report: OracleReport
) -> None:
    ours, theirs = dump_both(schema_oracle, json.dumps(value, indent=indent, ensure_ascii=indent is None))
    oracle_report.add("JSON values", "hypothesis", identical=int(ours == theirs), total=1)
    assert ours == theirs
