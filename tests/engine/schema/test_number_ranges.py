"""Bounds on numbers in the extended dialect (constraintd/engine/schema/number_ranges.py): a number's grammar
takes exactly the JSON numbers without exponent whose decimal value is within the bounds."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, Final

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.schema.convert import convert_json_schema
from constraintd.engine.schema.number_ranges import Bound, number_range_rule

BYTES: Final = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])
jsonschema = pytest.importorskip("jsonschema")


def takes(grammar: Grammar, text: str) -> bool:
    matcher = Matcher(grammar)
    return matcher.accept_bytes(text.encode()) and matcher.is_complete()


def within(value: Decimal, low: Bound | None, high: Bound | None) -> bool:
    if low is not None and (value < low.value or (low.strict and value == low.value)):
        return False
    return not (high is not None and (value > high.value or (high.strict and value == high.value)))


decimals = st.builds(lambda sign, whole, fraction: Decimal(f"{sign}{whole}.{fraction}"),
                     st.sampled_from(["", "-"]), st.integers(0, 120), st.from_regex(r"\A[0-9]{1,3}\Z"))
bounds = st.none() | st.builds(Bound, decimals, st.booleans())
texts = st.builds(lambda sign, whole, fraction: f"{sign}{whole}{fraction}", st.sampled_from(["", "-"]),
                  st.integers(0, 130).map(str), st.sampled_from(["", ".0", ".5", ".25", ".999", ".05", ".1"])
                  | st.from_regex(r"\A\.[0-9]{1,5}\Z"))


@settings(max_examples=300, deadline=None)
@given(bounds, bounds, st.lists(texts, min_size=20, max_size=20))
def test_a_number_range_takes_exactly_its_numbers(low: Bound | None, high: Bound | None,
                                                  candidates: list[str]) -> None:
    rule = number_range_rule(low, high)
    if rule is None:
        assert not any(within(Decimal(text), low, high) for text in candidates)
        return
    grammar = Grammar.from_gbnf(f"root ::= {rule}\n", BYTES)
    ends = [bound.value for bound in (low, high) if bound is not None]
    candidates += [format(value, "f") for value in ends] + [format(value + delta, "f") for value in ends
                                                           for delta in (Decimal("0.001"), Decimal("-0.001"))]
    for text in candidates:
        assert takes(grammar, text) == within(Decimal(text), low, high), (low, high, text)
    for text in ("1e2", "1.", ".5", "01", "--1", "+1", "1.5e0", ""):
        assert not takes(grammar, text)


@pytest.mark.parametrize(("schema", "cases"), [
    ({"minimum": 0.5}, {"0.5": True, "0.49": False, "0.50001": True, "1": True, "-0.5": False, "0": False}),
    ({"exclusiveMinimum": 0}, {"0": False, "-0": False, "0.000": False, "0.0001": True, "-1": False}),
    ({"maximum": -2.5}, {"-2.5": True, "-2.49": False, "-3": True, "-2.50": True, "2.5": False}),
    ({"exclusiveMaximum": 100, "minimum": -1}, {"100": False, "99.999": True, "-1": True, "-1.01": False}),
    ({"minimum": 1, "exclusiveMinimum": 1}, {"1": False, "1.0": False, "1.1": True}),  # the tighter holds
    ({"minimum": 2, "exclusiveMinimum": True}, {"2": False, "2.01": True}),  # draft 4
    ({"minimum": 0, "maximum": 0}, {"0": True, "-0": True, "0.0": True, "0.01": False, "-0.01": False}),
], ids=lambda value: json.dumps(value) if isinstance(value, dict) and "minimum" in str(value) else None)
def test_number_bounds_hold(schema: dict[str, Any], cases: dict[str, bool]) -> None:
    schema = {"type": "number", **schema}
    conversion = convert_json_schema(json.dumps(schema), dialect="extended", strict=True)
    grammar = Grammar.from_gbnf(conversion.grammar, BYTES)
    validator = jsonschema.Draft4Validator(schema) if schema.get("exclusiveMinimum") is True else (
        jsonschema.Draft202012Validator(schema))
    for text, expected in cases.items():
        assert validator.is_valid(json.loads(text)) == expected, text
        assert takes(grammar, text) == expected, text


@pytest.mark.parametrize("schema", [
    {"type": "number", "minimum": 2, "maximum": 1},  # admits nothing
    {"type": "number", "minimum": 1e60},  # past the dialect's digits
    {"type": "number", "minimum": 0, "multipleOf": 0.5},
    {"type": "number", "minimum": 0, "exclusiveMinimum": "x"},
], ids=["crossed", "huge", "multipleOf", "unreadable"])
def test_what_the_dialect_leaves_stays_reported(schema: dict[str, Any]) -> None:
    assert convert_json_schema(json.dumps(schema), dialect="extended").unenforced
