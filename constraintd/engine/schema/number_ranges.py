# Bounds on JSON numbers as an exact GBNF expression, for the extended dialect (schema/extended.py).
#
# Contract: `number_range_rule(low, high)` is a GBNF expression taking exactly the JSON numbers written
# without an exponent (`-`? integer part, `.` fraction?) whose decimal value lies within the bounds, each a
# `Bound` (a decimal value, inclusive or not) or None. Values are compared as decimals, exactly (JSON
# Schema's numbers are mathematical values; a bound is the shortest decimal of the double it was read as).
# A spelling with an exponent (`1e3`) is refused although valid; `-0` is the value 0. The integer part of an
# open side takes at most `OPEN_DIGITS` digits (the bound's own when more), as llama.cpp's numbers; the
# fraction takes any number of digits.
#
# `integer_range_rule(low, high)` is the integers of [low, high] alone, in JSON's spelling.
#
# How: a decimal's fraction digits, compared padded with zeros, form a regular language between two bounds:
# one pass over the bounds' digits (`_fraction`) writes it, a group per digit. The integer part is a range
# of integers (extended.py's writer) with a fraction of its own at each end.
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Final

__all__ = ["OPEN_DIGITS", "Bound", "integer_range_rule", "number_range_rule"]

OPEN_DIGITS: Final = 16
_ANY_FRACTION: Final = '("." [0-9]+)?'


@dataclass(frozen=True, slots=True)
class Bound:
    value: Decimal
    strict: bool = False  # exclusive


@dataclass(frozen=True, slots=True)
class _Digits:
    """A language of fraction digit strings: `nonempty` (None: no non-empty string) and whether the empty
    string (the value 0, no fraction written) is in it."""

    nonempty: str | None
    empty: bool

    def full(self) -> str | None:
        """The language as one expression ("" for the empty string alone), None when it is empty."""
        if self.nonempty is None:
            return "" if self.empty else None
        return f"({self.nonempty})?" if self.empty else self.nonempty

    def after_point(self) -> str | None:
        """The fraction as JSON writes it: nothing (the empty string), or "." and digits."""
        if self.nonempty is None:
            return "" if self.empty else None
        return f'("." ({self.nonempty}))?' if self.empty else f'"." ({self.nonempty})'


def _split(value: Decimal) -> tuple[int, str]:
    """A non-negative decimal's integer part and its fraction digits, trailing zeros dropped."""
    text = format(value, "f")
    integer, _, fraction = text.partition(".")
    return int(integer), fraction.rstrip("0")


def _digit_class(low: int, high: int) -> str:
    return f"[{low}]" if low == high else f"[{low}-{high}]"


def _fraction(low: str | None, low_strict: bool, high: str | None, high_strict: bool) -> _Digits:
    """Fraction digit strings s with low < s < high (or <=), compared as 0.s; None: no bound that side."""
    empty = ((low is None or (low == "" and not low_strict))
             and (high is None or high != "" or not high_strict))
    # a bound of 0 consumes no digit: it is written here, so that every step below shortens a bound
    if low == "" and not low_strict:
        low = None
    if high == "":
        return _Digits('"0"+', True) if low is None and not high_strict else _Digits(None, empty)
    if low is None and high is None:
        return _Digits("[0-9]+", True)
    if low == "" and high is None:  # strictly above 0
        return _Digits('"0"* [1-9] [0-9]*', False)
    # the first digit d: its own bounds for the rest (None: open), or no string starts with d
    groups: dict[tuple[str | None, str | None], list[int]] = {}
    for digit in range(10):
        if low is None:
            rest_low: str | None = None
        else:
            first_low = int(low[0]) if low else 0
            if digit < first_low:
                continue
            rest_low = (low[1:] if low else "") if digit == first_low else None
        if high is None:
            rest_high: str | None = None
        else:
            first_high = int(high[0]) if high else 0
            if digit > first_high:
                continue
            rest_high = (high[1:] if high else "") if digit == first_high else None
        groups.setdefault((rest_low, rest_high), []).append(digit)
    alternatives = []
    for (rest_low, rest_high), digits in groups.items():
        rest = _fraction(rest_low, low_strict, rest_high, high_strict).full()
        if rest is None:
            continue
        # digits sharing the same rest are contiguous (at most the low digit, the middle, the high digit)
        head = _digit_class(digits[0], digits[-1])
        alternatives.append(f"{head} {rest}".rstrip())
    if not alternatives:
        return _Digits(None, empty)
    return _Digits(alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")", empty)


def _span(low: str, high: str) -> str:
    """GBNF for the digit strings of one length between `low` and `high` (inclusive, low <= high)."""
    if low == high:
        return f'"{low}"'
    i = 0
    while low[i] == high[i]:
        i += 1
    prefix = f'"{low[:i]}" ' if i else ""
    rest = len(low) - i - 1
    a, b = low[i], high[i]
    if rest == 0:
        return f"{prefix}[{a}-{b}]"
    tail = f" [0-9]{{{rest}}}" if rest > 1 else " [0-9]"
    alternatives = []
    first = a if low[i + 1 :] == "0" * rest else None  # the low digit's whole block is in range
    last = b if high[i + 1 :] == "9" * rest else None
    if first is None:
        alternatives.append(f'"{a}" ({_span(low[i + 1 :], "9" * rest)})')
    middle_low = a if first is not None else chr(ord(a) + 1)
    middle_high = b if last is not None else chr(ord(b) - 1)
    if middle_low <= middle_high:
        digits = f"[{middle_low}]" if middle_low == middle_high else f"[{middle_low}-{middle_high}]"
        alternatives.append(digits + tail)
    if last is None:
        alternatives.append(f'"{b}" ({_span("0" * rest, high[i + 1 :])})')
    body = " | ".join(alternatives)
    return f"{prefix}({body})" if prefix or len(alternatives) > 1 else body


def _naturals(low: int, high: int) -> list[str]:
    """Alternatives for the naturals of [low, high] (0 <= low <= high), one or more per length."""
    alternatives = []
    full: list[int] = []  # lengths of two digits or more whose every number is in range, in a row
    for length in range(len(str(low)), len(str(high)) + 1):
        first = max(low, 10 ** (length - 1) if length > 1 else 0)
        last = min(high, 10**length - 1)
        if length > 1 and (first, last) == (10 ** (length - 1), 10**length - 1):
            full.append(length)
        elif first <= last:
            alternatives.append(_span(str(first), str(last)))
    if full:
        low_rest, high_rest = full[0] - 1, full[-1] - 1
        counts = f"{{{low_rest}}}" if low_rest == high_rest else f"{{{low_rest},{high_rest}}}"
        alternatives.insert(1 if alternatives and len(str(low)) < full[0] else 0, f"[1-9] [0-9]{counts}")
    return alternatives


def integer_range_rule(low: int, high: int) -> str:
    """A GBNF expression taking exactly the JSON integers of [low, high] (low <= high), written without
    leading zeros and never as "-0"."""
    assert low <= high
    alternatives = []
    if low < 0:
        negatives = _naturals(max(1, -high), -low)
        alternatives.append('"-" (' + " | ".join(negatives) + ")")
    if high >= 0:
        alternatives.extend(_naturals(max(0, low), high))
    return " | ".join(alternatives)


def _magnitudes(low: Bound | None, high: Bound | None, widest: int) -> list[str]:
    """Alternatives for the non-negative numbers within the bounds (low >= 0, high >= 0 when given)."""
    low_int, low_fraction = _split(low.value) if low is not None else (0, "")
    low_strict = low.strict if low is not None else False
    if high is not None:
        high_int, high_fraction = _split(high.value)
    alternatives = []
    if high is not None and high_int == low_int:
        fraction = _fraction(low_fraction, low_strict, high_fraction, high.strict).after_point()
        if fraction is not None:
            alternatives.append(f'"{low_int}" {fraction}'.rstrip())
        return alternatives
    fraction = _fraction(low_fraction, low_strict, None, False).after_point()
    if fraction is not None:
        alternatives.append(f'"{low_int}" {fraction}'.rstrip())
    middle_high = high_int - 1 if high is not None else widest
    if low_int + 1 <= middle_high:
        alternatives.append(f"({integer_range_rule(low_int + 1, middle_high)}) {_ANY_FRACTION}")
    if high is not None:
        fraction = _fraction(None, False, high_fraction, high.strict).after_point()
        if fraction is not None:
            alternatives.append(f'"{high_int}" {fraction}'.rstrip())
    return alternatives


def number_range_rule(low: Bound | None, high: Bound | None) -> str | None:
    """A GBNF expression for the JSON numbers (without exponent) within the bounds; None when none is."""
    digits = max([OPEN_DIGITS] + [len(str(int(abs(bound.value)))) for bound in (low, high) if bound])
    widest = 10**digits - 1
    alternatives = []
    zero = Bound(Decimal(0))
    if low is None or low.value <= 0:  # "-" and a magnitude: x >= low is -x <= -low (and -0 is 0)
        magnitude_high = Bound(-low.value, low.strict) if low is not None else None
        magnitude_low = Bound(-high.value, high.strict) if high is not None and high.value <= 0 else zero
        if magnitude_high is None or magnitude_low.value <= magnitude_high.value:
            negatives = _magnitudes(magnitude_low, magnitude_high, widest)
            if negatives:
                alternatives.append('"-" (' + " | ".join(negatives) + ")")
    if high is None or high.value >= 0:
        non_negative_low = low if low is not None and low.value >= 0 else zero
        if high is None or non_negative_low.value <= high.value:
            alternatives.extend(_magnitudes(non_negative_low, high, widest))
    return " | ".join(alternatives) if alternatives else None
