# Doubles printed as nlohmann::json prints them: its `to_chars`, which is Grisu2 plus a %g-like layout.
#
# Contract: `format_double(x)` returns, for every finite double, the exact characters nlohmann's
# `dump()` writes for a number_float holding x (llama.cpp prints `enum`/`const` floats that way, so
# these characters end up inside grammar literals). Grisu2 is not always the shortest round-trip form
# (Python's `repr` is), so it is ported step by step rather than approximated with `repr`.
#
# Invariants:
# - Only integer arithmetic; every uint64 operation of the original stays below 2**64 (the original's
#   asserts say so), so Python ints reproduce it without masking.
# - The cached powers of ten (nlohmann's 79-entry table) are computed here, rounded to nearest; the
#   tests compare them with the table in the reference's json.hpp.
from __future__ import annotations

import math
import struct
from typing import Final

__all__ = ["CACHED_POWERS", "format_double"]

_ALPHA: Final = -60
_GAMMA: Final = -32
_POWERS_MIN_DEC_EXP: Final = -300
_POWERS_DEC_STEP: Final = 8
_POWERS_COUNT: Final = 79
_MIN_EXP: Final = -4  # fixed notation from 10**-4 ...
_MAX_EXP: Final = 15  # ... below 10**15 (std::numeric_limits<double>::digits10)


def _cached_power(k: int) -> tuple[int, int, int]:
    """(f, e, k) with f * 2**e the nearest 64-bit-significand value to 10**k."""
    if k >= 0:
        num, den = 10**k, 1
    else:
        num, den = 1, 10**-k
    e = (num.bit_length() - den.bit_length()) - 64
    while True:
        scaled_num, scaled_den = (num, den << e) if e >= 0 else (num << -e, den)
        f, rest = divmod(scaled_num, scaled_den)
        if 2 * rest >= scaled_den:
            f += 1
        if f >= 1 << 64:
            e += 1
        elif f < 1 << 63:
            e -= 1
        else:
            return f, e, k


CACHED_POWERS: Final[tuple[tuple[int, int, int], ...]] = tuple(
    _cached_power(_POWERS_MIN_DEC_EXP + _POWERS_DEC_STEP * i) for i in range(_POWERS_COUNT)
)


def _mul(xf: int, xe: int, yf: int, ye: int) -> tuple[int, int]:
    # diyfp::mul: the upper 64 bits of the 128-bit product, rounded (ties up) on the 32-bit halves.
    u_lo, u_hi = xf & 0xFFFFFFFF, xf >> 32
    v_lo, v_hi = yf & 0xFFFFFFFF, yf >> 32
    p0, p1, p2, p3 = u_lo * v_lo, u_lo * v_hi, u_hi * v_lo, u_hi * v_hi
    q = (p0 >> 32) + (p1 & 0xFFFFFFFF) + (p2 & 0xFFFFFFFF) + (1 << 31)
    return p3 + (p2 >> 32) + (p1 >> 32) + (q >> 32), xe + ye + 64


def _normalize(f: int, e: int) -> tuple[int, int]:
    shift = 64 - f.bit_length()
    return f << shift, e - shift


def _boundaries(value: float) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """compute_boundaries: the normalized value and its lower and upper rounding boundaries."""
    bits = struct.unpack("<Q", struct.pack("<d", value))[0]
    biased, fraction = bits >> 52, bits & ((1 << 52) - 1)
    if biased == 0:
        vf, ve = fraction, -1074
    else:
        vf, ve = fraction + (1 << 52), biased - 1075
    plus_f, plus_e = _normalize(2 * vf + 1, ve - 1)
    if fraction == 0 and biased > 1:
        minus_f, minus_e = 4 * vf - 1, ve - 2
    else:
        minus_f, minus_e = 2 * vf - 1, ve - 1
    minus_f <<= minus_e - plus_e
    return _normalize(vf, ve), (minus_f, plus_e), (plus_f, plus_e)


def _round_weed(digits: list[int], dist: int, delta: int, rest: int, ten_k: int) -> None:
    # grisu2_round: move the last digit down while that brings the value closer to w.
    while rest < dist and delta - rest >= ten_k and (
        rest + ten_k < dist or dist - rest > rest + ten_k - dist
    ):
        digits[-1] -= 1
        rest += ten_k


def _digit_gen(m_minus: int, w: int, m_plus: int, e: int) -> tuple[list[int], int]:
    """grisu2_digit_gen: digits of a number in [M-, M+], and the decimal exponent to add."""
    delta = m_plus - m_minus
    dist = m_plus - w
    one_f = 1 << -e
    p1 = m_plus >> -e
    p2 = m_plus & (one_f - 1)
    pow10 = 10 ** (len(str(p1)) - 1)
    digits: list[int] = []
    n = len(str(p1))
    while n > 0:
        d, p1 = divmod(p1, pow10)
        digits.append(d)
        n -= 1
        rest = (p1 << -e) + p2
        if rest <= delta:
            _round_weed(digits, dist, delta, rest, pow10 << -e)
            return digits, n
        pow10 //= 10
    m = 0
    while True:
        p2 *= 10
        digits.append(p2 >> -e)
        p2 &= one_f - 1
        m += 1
        delta *= 10
        dist *= 10
        if p2 <= delta:
            break
    _round_weed(digits, dist, delta, p2, one_f)
    return digits, -m


def _grisu2(value: float) -> tuple[str, int]:
    (vf, ve), (minus_f, _), (plus_f, plus_e) = _boundaries(value)
    vf <<= ve - plus_e  # v shares the boundaries' exponent (normalize_to, as grisu2's caller does)
    f = _ALPHA - plus_e - 1
    k = (f * 78913) // (1 << 18) + (1 if f > 0 else 0)
    if f * 78913 < 0 and (f * 78913) % (1 << 18):
        k += 1  # C++ division truncates toward zero
    index = (-_POWERS_MIN_DEC_EXP + k + (_POWERS_DEC_STEP - 1)) // _POWERS_DEC_STEP
    cf, ce, ck = CACHED_POWERS[index]
    w, we = _mul(vf, plus_e, cf, ce)
    w_minus, _ = _mul(minus_f, plus_e, cf, ce)
    w_plus, _ = _mul(plus_f, plus_e, cf, ce)
    digits, exponent = _digit_gen(w_minus + 1, w, w_plus - 1, we)
    return "".join(map(str, digits)), exponent - ck


def _layout(digits: str, exponent: int) -> str:
    """format_buffer: fixed notation for 1e-4 <= v < 1e15, else d.ddde+XX."""
    k = len(digits)
    n = k + exponent
    if k <= n <= _MAX_EXP:
        return digits + "0" * (n - k) + ".0"
    if 0 < n <= _MAX_EXP:
        return digits[:n] + "." + digits[n:]
    if _MIN_EXP < n <= 0:
        return "0." + "0" * -n + digits
    mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
    e = n - 1
    return f"{mantissa}e{'-' if e < 0 else '+'}{abs(e):02d}"


def format_double(value: float) -> str:
    """The text nlohmann::json's `dump()` gives a finite double ("2.0", "1e+16", "-0.0", "1.5e-07").

    Raises:
        ValueError: the value is not finite (nlohmann prints those as null; JSON cannot hold them).
    """
    if not math.isfinite(value):
        raise ValueError(f"{value} is not a finite double")
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    value = abs(value)
    if value == 0:
        return sign + "0.0"
    return sign + _layout(*_grisu2(value))
