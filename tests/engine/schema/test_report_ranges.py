"""Which integer ranges llama.cpp's grammar holds (`range_holds` of schema/report.py: it takes no text but
integers of the range), checked against the grammar itself: every integer near the bounds and near each
power of ten is offered to the engine's matcher as its digits, and so are texts with leading zeros, which
JSON refuses. Integers of the range the grammar refuses are llama.cpp's choice and not looked at."""

from __future__ import annotations

import itertools
import json
from typing import Final

import pytest

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.schema.convert import convert_json_schema
from constraintd.engine.schema.nodes import INT64_MAX, INT64_MIN
from constraintd.engine.schema.report import range_holds

BYTES: Final = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])
BOUNDS: Final = sorted({0, *(sign * magnitude for sign in (1, -1) for magnitude in (
    1, 2, 9, 10, 11, 12, 19, 20, 21, 90, 99, 100, 101, 105, 110, 111, 120, 199, 200, 205, 1000, 1005, 1010,
    1100, 1205, 2000, 9999, 10000, 10203,
))})
LEADING_ZEROS: Final = ("00", "-00", *(f"{sign}{'0' * zeros}{'1' * ones}" for sign in ("", "-")
                                      for zeros in (1, 2) for ones in range(1, 7)))


def probes(bound: int) -> set[int]:
    # near the bound, near its leading digits (a recursion that loses zeros takes those), near powers of ten
    digits = str(abs(bound))
    sign = -1 if bound < 0 else 1
    heads = {sign * int(digits[:k]) + delta for k in range(1, len(digits) + 1) for delta in range(-2, 3)}
    shorter = {sign * int(digits[0] + second + fill * (length - 2)) for length in range(2, len(digits))
               for second in "0123456789" for fill in "09"}
    heads |= shorter
    near = {bound + delta for delta in range(-12, 13)} | heads
    tens = {sign * (10**k + delta) for k in range(1, 6) for delta in (-1, 0, 1) for sign in (1, -1)}
    return near | tens | set(range(-25, 26))


def holds(minimum: int | None, maximum: int | None) -> bool:
    schema: dict[str, object] = {"type": "integer"}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    grammar = Grammar.from_gbnf(convert_json_schema(json.dumps(schema)).grammar, BYTES)

    def takes(text: str) -> bool:
        matcher = Matcher(grammar)
        return matcher.accept_bytes(text.encode()) and matcher.is_complete()

    numbers = probes(minimum if minimum is not None else 0) | probes(maximum if maximum is not None else 0)
    outside = [n for n in numbers
               if (minimum is not None and n < minimum) or (maximum is not None and n > maximum)]
    return not any(takes(str(n)) for n in outside) and not any(takes(text) for text in LEADING_ZEROS)


CASES: Final = [(low, None) for low in BOUNDS] + [(None, high) for high in BOUNDS] + [
    (low, high) for low, high in itertools.combinations(BOUNDS, 2) if abs(low) < 300 and abs(high) < 300
]


@pytest.mark.parametrize(("minimum", "maximum"), CASES, ids=[f"{low}..{high}" for low, high in CASES])
def test_range_holds_says_what_the_grammar_does(minimum: int | None, maximum: int | None) -> None:
    low = INT64_MIN if minimum is None else minimum
    high = INT64_MAX if maximum is None else maximum
    assert range_holds(low, high) == holds(minimum, maximum)
