# Counted repetitions and integer ranges as GBNF text: llama.cpp's `build_repetition` and
# `build_min_max_int` (common/json-schema-to-grammar.cpp), ported character for character.
#
# Contract: the same arguments give the same text as llama.cpp, including for arguments llama.cpp does
# not guard against (minimum above maximum, negative counts, digits out of '0'..'9' produced by its char
# arithmetic). `INT_MAX` as a maximum count means "unbounded", as it does there.
#
# Invariants: `build_min_max_int` recurses at most once per decimal digit (about 20 levels); integers are
# the int64 values llama.cpp holds, negation wraps as two's complement does.
from __future__ import annotations

from typing import Final

from constraintd.errors import SchemaError

__all__ = ["INT_MAX", "build_min_max_int", "build_repetition"]

INT_MAX: Final = 2**31 - 1
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_FAILED: Final = "JSON schema conversion failed:\n"


def build_repetition(item_rule: str, min_items: int, max_items: int, separator_rule: str = "") -> str:
    """`item_rule` repeated min..max times (max INT_MAX: unbounded), separated by `separator_rule`."""
    has_max = max_items != INT_MAX
    if max_items == 0:
        return ""
    if min_items == 0 and max_items == 1:
        return item_rule + "?"
    if not separator_rule:
        if min_items == 1 and not has_max:
            return item_rule + "+"
        if min_items == 0 and not has_max:
            return item_rule + "*"
        return f"{item_rule}{{{min_items},{max_items if has_max else ''}}}"
    result = item_rule + " " + build_repetition(
        f"({separator_rule} {item_rule})", 0 if min_items == 0 else min_items - 1,
        max_items - 1 if has_max else max_items,
    )
    return f"({result})?" if min_items == 0 else result


def _wrap(value: int) -> int:
    return (value + 2**63) % 2**64 - 2**63


def _shift(digit: str, by: int) -> str:
    # C++ char arithmetic: '0' - 1 is '/', '9' + 1 is ':'
    return chr(ord(digit) + by)


class _RangeWriter:
    """One call of build_min_max_int: appends to `out` as llama.cpp's stringstream does."""

    def __init__(self) -> None:
        self.out: list[str] = []

    def digit_range(self, low: str, high: str) -> None:
        self.out.append(f"[{low}]" if low == high else f"[{low}-{high}]")

    def more_digits(self, min_digits: int, max_digits: int) -> None:
        self.out.append("[0-9]")
        if min_digits == max_digits == 1:
            return
        self.out.append(f"{{{min_digits}")
        if max_digits != min_digits:
            self.out.append("," + (str(max_digits) if max_digits != INT_MAX else ""))
        self.out.append("}")

    def uniform_range(self, low: str, high: str) -> None:
        i = 0
        while i < len(low) and i < len(high) and low[i] == high[i]:
            i += 1
        if i > 0:
            self.out.append(f'"{low[:i]}"')
        if i < len(low) and i < len(high):
            if i > 0:
                self.out.append(" ")
            sub_len = len(low) - i - 1
            if sub_len > 0:
                low_sub, high_sub = low[i + 1 :], high[i + 1 :]
                sub_zeros, sub_nines = "0" * sub_len, "9" * sub_len
                to_reached = False
                self.out.append("(")
                if low_sub == sub_zeros:
                    self.digit_range(low[i], _shift(high[i], -1))
                    self.out.append(" ")
                    self.more_digits(sub_len, sub_len)
                else:
                    self.out.append(f"[{low[i]}] (")
                    self.uniform_range(low_sub, sub_nines)
                    self.out.append(")")
                    if ord(low[i]) < ord(high[i]) - 1:
                        self.out.append(" | ")
                        if high_sub == sub_nines:
                            self.digit_range(_shift(low[i], 1), high[i])
                            to_reached = True
                        else:
                            self.digit_range(_shift(low[i], 1), _shift(high[i], -1))
                        self.out.append(" ")
                        self.more_digits(sub_len, sub_len)
                if not to_reached:
                    self.out.append(" | ")
                    self.digit_range(high[i], high[i])
                    self.out.append(" ")
                    self.uniform_range(sub_zeros, high_sub)
                self.out.append(")")
            else:
                self.out.append(f"[{low[i]}-{high[i]}]")

    def min_max(self, min_value: int, max_value: int, decimals_left: int = 16, top_level: bool = True,
                ) -> None:
        has_min = min_value != _INT64_MIN
        has_max = max_value != _INT64_MAX
        if has_min and has_max:
            self.both(min_value, max_value, decimals_left)
            return
        less_decimals = max(decimals_left - 1, 1)
        if has_min:
            self.only_min(min_value, decimals_left, less_decimals, top_level)
            return
        if has_max:
            if max_value >= 0:
                if top_level:
                    self.out.append('"-" [1-9] ')
                    self.more_digits(0, less_decimals)
                    self.out.append(" | ")
                self.min_max(0, max_value, decimals_left, True)
            else:
                self.out.append('"-" (')
                self.min_max(_wrap(-max_value), _INT64_MAX, decimals_left, False)
                self.out.append(")")
            return
        raise SchemaError(f"{_FAILED}At least one of min_value or max_value must be set")

    def both(self, min_value: int, max_value: int, decimals_left: int) -> None:
        if min_value < 0 and max_value < 0:
            self.out.append('"-" (')
            self.min_max(_wrap(-max_value), _wrap(-min_value), decimals_left, True)
            self.out.append(")")
            return
        if min_value < 0:
            self.out.append('"-" (')
            self.min_max(0, _wrap(-min_value), decimals_left, True)
            self.out.append(") | ")
            min_value = 0
        min_s, max_s = str(min_value), str(max_value)
        for digits in range(len(min_s), len(max_s)):
            self.uniform_range(min_s, "9" * digits)
            min_s = "1" + "0" * digits
            self.out.append(" | ")
        self.uniform_range(min_s, max_s)

    def only_min(self, min_value: int, decimals_left: int, less_decimals: int, top_level: bool) -> None:
        if min_value < 0:
            self.out.append('"-" (')
            self.min_max(_INT64_MIN, _wrap(-min_value), decimals_left, False)
            self.out.append(") | [0] | [1-9] ")
            self.more_digits(0, decimals_left - 1)
        elif min_value == 0:
            if top_level:
                self.out.append("[0] | [1-9] ")
                self.more_digits(0, less_decimals)
            else:
                self.more_digits(1, decimals_left)
        elif min_value <= 9:
            c = chr(ord("0") + min_value)
            range_start = "1" if top_level else "0"
            if c > range_start:
                self.digit_range(range_start, _shift(c, -1))
                self.out.append(" ")
                self.more_digits(1, less_decimals)
                self.out.append(" | ")
            self.digit_range(c, "9")
            self.out.append(" ")
            self.more_digits(0, less_decimals)
        else:
            min_s = str(min_value)
            c = min_s[0]
            if c > "1":
                self.digit_range("1" if top_level else "0", _shift(c, -1))
                self.out.append(" ")
                self.more_digits(len(min_s), less_decimals)
                self.out.append(" | ")
            self.digit_range(c, c)
            self.out.append(" (")
            self.min_max(int(min_s[1:]), _INT64_MAX, less_decimals, False)
            self.out.append(")")
            if c < "9":
                self.out.append(" | ")
                self.digit_range(_shift(c, 1), "9")
                self.out.append(" ")
                self.more_digits(len(min_s) - 1, less_decimals)


def build_min_max_int(min_value: int, max_value: int) -> str:
    """The GBNF alternatives matching the decimal integers in [min_value, max_value] (int64 bounds).

    Raises:
        SchemaError: both bounds are the "unbounded" values (llama.cpp's runtime_error, its message).
    """
    writer = _RangeWriter()
    writer.min_max(min_value, max_value)
    return "".join(writer.out)
