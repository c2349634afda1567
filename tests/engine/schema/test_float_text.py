"""Doubles printed as nlohmann::json prints them (Grisu2), checked against nlohmann's own table and output."""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constraintd.engine.schema.float_text import CACHED_POWERS, format_double
from tests.conftest import OracleReport
from tests.schema_oracle.build import harness_binary, run_harness

finite_floats = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    # every bit pattern, so that the rare doubles where Grisu2 is not the shortest form come up too
    st.integers(0, 2**64 - 1)
    .map(lambda bits: float(struct.unpack("<d", struct.pack("<Q", bits))[0]))
    .filter(math.isfinite),
)


@pytest.fixture(scope="session")
def schema_oracle(llama_cpp_dir: Path) -> Path:
    return harness_binary(llama_cpp_dir)


def test_cached_powers_are_the_table_of_the_reference_json_hpp(llama_cpp_dir: Path) -> None:
    source = (llama_cpp_dir / "vendor" / "nlohmann" / "json.hpp").read_text()
    table = [(int(f, 16), int(e), int(k))
             for f, e, k in re.findall(r"\{ 0x([0-9A-F]{16}), *(-?\d+), *(-?\d+) \}", source)]
    assert len(table) == 79
    assert list(CACHED_POWERS) == table


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (2.0, "2.0"), (-0.0, "-0.0"), (0.0, "0.0"), (0.1, "0.1"), (1.5e-7, "1.5e-07"), (0.0001, "0.0001"),
        (0.00001, "1e-05"), (1e14, "100000000000000.0"), (1e15, "1e+15"), (1e16, "1e+16"),
        (123.456, "123.456"),
        (5e-324, "5e-324"), (1.7976931348623157e308, "1.7976931348623157e+308"), (-2.5e100, "-2.5e+100"),
        # Grisu2 is not always the shortest form: Python's repr gives 2.951749533409803e+16 here
        (2.951749533409803e16, "2.9517495334098032e+16"),
    ],
    ids=lambda v: repr(v),
)
def test_known_texts(value: float, text: str) -> None:
    assert format_double(value) == text


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_non_finite_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="not a finite double"):
        format_double(value)


@settings(max_examples=500)
@given(finite_floats)
def test_text_reads_back_as_the_same_double(value: float) -> None:
    text = format_double(value)
    assert float(text) == value
    assert math.copysign(1.0, float(text)) == math.copysign(1.0, value)


@pytest.mark.oracle
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(finite_floats, min_size=20, max_size=60))
def test_same_text_as_nlohmann(values: list[float], schema_oracle: Path, oracle_report: OracleReport) -> None:
    answer = run_harness(schema_oracle, json.dumps(values).encode(), mode="dump")
    theirs = answer.out.decode()[1:-1].split(",")
    ours = [format_double(value) for value in values]
    same = sum(map(str.__eq__, theirs, ours))
    oracle_report.add("double texts", "hypothesis", identical=same, total=len(values))
    assert answer.code == 0
    assert ours == theirs
