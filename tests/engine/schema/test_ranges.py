"""Counted repetitions and integer ranges as GBNF, compared with llama.cpp's converter in the oracle test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constraintd.engine.schema.ranges import INT_MAX, build_min_max_int, build_repetition
from constraintd.errors import SchemaError
from tests.conftest import OracleReport
from tests.schema_oracle.build import harness_binary
from tests.schema_oracle.compare import compare_conversion
from tests.schema_oracle.strategies import bounds

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@pytest.fixture(scope="session")
def schema_oracle(llama_cpp_dir: Path) -> Path:
    return harness_binary(llama_cpp_dir)


@pytest.mark.parametrize(
    ("args", "rule"),
    [
        (("x", 0, 0), ""),
        (("x", 0, 1), "x?"),
        (("x", 1, INT_MAX), "x+"),
        (("x", 0, INT_MAX), "x*"),
        (("x", 2, 5), "x{2,5}"),
        (("x", 3, INT_MAX), "x{3,}"),
        (("x", 0, INT_MAX, "s"), "(x (s x)*)?"),
        (("x", 2, 4, "s"), "x (s x){1,3}"),
        (("x", 1, 1, "s"), "x "),
        (("x", 5, 2), "x{5,2}"),
    ],
    ids=["none", "optional", "plus", "star", "bounded", "open", "separated-star", "separated-bounded",
         "separated-one", "min-above-max"],
)
def test_build_repetition(args: tuple[str, int, int], rule: str) -> None:
    assert build_repetition(*args) == rule


@pytest.mark.parametrize(
    ("bounds_", "rule"),
    [
        ((0, INT64_MAX), "[0] | [1-9] [0-9]{0,15}"),
        ((INT64_MIN, 0), '"-" [1-9] [0-9]{0,15} | "0"'),
        ((5, 30), '[5-9] | ([1-2] [0-9] | [3] "0")'),
        ((-5, -1), '"-" ([1-5])'),
    ],
    ids=["min-zero", "max-zero", "span-digits", "negative"],
)
def test_build_min_max_int(bounds_: tuple[int, int], rule: str) -> None:
    # expected texts as llama.cpp's converter writes them (root ::= (...)) for these bounds
    assert build_min_max_int(*bounds_) == rule


def test_range_with_no_bound_left_is_llamas_error() -> None:
    with pytest.raises(SchemaError, match="At least one of min_value or max_value must be set"):
        build_min_max_int(INT64_MIN, INT64_MAX)


@pytest.mark.oracle
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(
    st.fixed_dictionaries({}, optional={key: bounds for key in
                                        ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")}),
    min_size=1, max_size=8,
))
def test_integer_bounds_convert_as_in_llama_cpp(
    specs: list[dict[str, object]], schema_oracle: Path, oracle_report: OracleReport
) -> None:
    properties = {f"n{i}": {"type": "integer", **spec} for i, spec in enumerate(specs)}
    schema = {"type": "object", "properties": properties}
    verdict = compare_conversion(schema_oracle, json.dumps(schema))
    oracle_report.add("integer range grammars", "hypothesis", identical=int(verdict.verdict == "identical"),
                      total=1)
    assert verdict.verdict == "identical", verdict.detail
