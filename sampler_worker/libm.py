# The C library's single-precision `expf` and `logf`, bit for bit, over numpy arrays.
#
# llama.cpp's samplers call `expf` for every softmax and `logf` in min-p, typical-p and dynamic
# temperature, on float32 values, and compare or accumulate the results. numpy's own float32 `exp`
# and `log` are vectorised approximations that differ from the C library in the last bit for about
# a third of inputs, and even rounding a double `exp` to float32 differs for a few in ten thousand:
# enough to move a top-p cut or a cumulative sum. So we evaluate the algorithm glibc uses (Szabolcs
# Nagy's, from Arm's optimized-routines, in glibc since 2.27): reduce the argument with a 32-entry
# (exp) or 16-entry (log) table, evaluate a short polynomial in double precision, round once to
# float32. Every step is an IEEE double operation numpy performs identically.
#
# Contract: `expf(x)` and `logf(x)` equal glibc's `expf`/`logf` for every float32 input, including
# the special values (exp: -inf -> 0, overflow -> inf, underflow -> 0; log: 0 -> -inf, negative ->
# nan, subnormals normalised first). The tests check this against the C library itself. Elsewhere
# (macOS, Windows) llama.cpp uses a different C library and agreement is to within one ulp.
#
# `powf` (one scalar per step, only in dynamic temperature) calls the platform's C library.
#
# `expf_scalar` is the same `expf` on one Python float (a float32 value), for samplers that work on a
# handful of candidates, where each numpy call costs more than the arithmetic; `round_f32` rounds a
# double to float32 as C's cast does. A float32 operation (+, -, *, /) equals the double operation on
# the same operands rounded to float32 (double holds more than twice float32's precision), so the
# scalar samplers reproduce float32 arithmetic with `round_f32` after each operation.

from __future__ import annotations

import ctypes
import ctypes.util
import math
import struct
from fractions import Fraction
from functools import cache

import numpy as np
import numpy.typing as npt

__all__ = ["expf", "expf_scalar", "logf", "powf", "round_f32"]

F32 = npt.NDArray[np.float32]

# exp: x*N/ln2 = k + r, exp(x) = 2^(k/N) * 2^(r/N), 2^(r/N) by a cubic, N = 32.
_EXP_TABLE_BITS = 5
_EXP_N = 1 << _EXP_TABLE_BITS
_INV_LN2_N = float.fromhex("0x1.71547652b82fep+0") * _EXP_N
_ROUND_SHIFT = float.fromhex("0x1.8p+52")  # adding it rounds a double to an integer (ties to even)
_EXP_POLY = (
    float.fromhex("0x1.c6af84b912394p-5") / _EXP_N / _EXP_N / _EXP_N,
    float.fromhex("0x1.ebfce50fac4f3p-3") / _EXP_N / _EXP_N,
    float.fromhex("0x1.62e42ff0c52d6p-1") / _EXP_N,
)
_EXP_OVERFLOW = float.fromhex("0x1.62e42ep6")  # above: log(2^128), the result is +inf
_EXP_UNDERFLOW = float.fromhex("-0x1.9fe368p6")  # below: log(2^-150), the result is +0


def _exp2_table() -> npt.NDArray[np.uint64]:
    # tab[i] = bits(2^(i/N)) - (i << (52 - BITS)), so that adding k << (52 - BITS) to tab[k % N]
    # yields the bits of 2^(i/N) for any integer k in range. 2^(i/N) is rounded to the nearest
    # double from a 120-bit integer approximation (float(Fraction) rounds correctly).
    words = []
    for i in range(_EXP_N):
        value = float(Fraction(_root_of_two_scaled(i, _EXP_N, 120), 1 << 120))
        bits = int(np.array(value, dtype=np.float64).view(np.uint64))
        words.append((bits - (i << (52 - _EXP_TABLE_BITS))) % (1 << 64))
    return np.array(words, dtype=np.uint64)


def _root_of_two_scaled(i: int, n: int, precision: int) -> int:
    # floor(2^(i/n) * 2^precision) by bisection on integers: y^n <= 2^(i + n * precision).
    target = 1 << (i + n * precision)
    low, high = 1 << precision, 1 << (precision + 1)
    while high - low > 1:
        middle = (low + high) // 2
        if middle**n <= target:
            low = middle
        else:
            high = middle
    return low


# log: x = 2^k z with z in [OFF, 2 OFF), log(x) = k ln2 + log(c) + log1p(z/c - 1), c tabulated.
# invc and logc of each of the 16 subintervals, ln2 and the polynomial: the constants of Arm's
# optimized-routines logf (MIT licence), which glibc ships as __logf_data.
_LOG_TABLE = (
    ("0x1.661ec79f8f3bep+0", "-0x1.57bf7808caadep-2"),
    ("0x1.571ed4aaf883dp+0", "-0x1.2bef0a7c06ddbp-2"),
    ("0x1.49539f0f010bp+0", "-0x1.01eae7f513a67p-2"),
    ("0x1.3c995b0b80385p+0", "-0x1.b31d8a68224e9p-3"),
    ("0x1.30d190c8864a5p+0", "-0x1.6574f0ac07758p-3"),
    ("0x1.25e227b0b8eap+0", "-0x1.1aa2bc79c81p-3"),
    ("0x1.1bb4a4a1a343fp+0", "-0x1.a4e76ce8c0e5ep-4"),
    ("0x1.12358f08ae5bap+0", "-0x1.1973c5a611cccp-4"),
    ("0x1.0953f419900a7p+0", "-0x1.252f438e10c1ep-5"),
    ("0x1p+0", "0x0p+0"),
    ("0x1.e608cfd9a47acp-1", "0x1.aa5aa5df25984p-5"),
    ("0x1.ca4b31f026aap-1", "0x1.c5e53aa362eb4p-4"),
    ("0x1.b2036576afce6p-1", "0x1.526e57720db08p-3"),
    ("0x1.9c2d163a1aa2dp-1", "0x1.bc2860d22477p-3"),
    ("0x1.886e6037841edp-1", "0x1.1058bc8a07ee1p-2"),
    ("0x1.767dcf5534862p-1", "0x1.4043057b6ee09p-2"),
)
_LOG_INVC = np.array([float.fromhex(invc) for invc, _ in _LOG_TABLE])
_LOG_LOGC = np.array([float.fromhex(logc) for _, logc in _LOG_TABLE])
_LN2 = float.fromhex("0x1.62e42fefa39efp-1")
_LOG_POLY = tuple(float.fromhex(c) for c in ("-0x1.00ea348b88334p-2", "0x1.5575b0be00b6ap-2",
                                             "-0x1.ffffef20a4123p-2"))
_LOG_OFF = 0x3F330000
_F32_ONE_BITS = 0x3F800000
_F32_INF_BITS = 0x7F800000
_F32_MIN_NORMAL_BITS = 0x00800000


@cache
def _exp_table() -> npt.NDArray[np.uint64]:
    return _exp2_table()


def expf(x: F32 | np.float32 | float) -> F32:
    """`expf` of every element, as glibc computes it.

    Args:
        x: float32 values (a Python float is first rounded to float32, as C would).

    Returns:
        A float32 array of x's shape (0-d for a scalar).
    """
    xf = np.asarray(x, dtype=np.float32)
    # Every value in range (a softmax's are, up to its -inf): no special case to patch in afterwards. The
    # common case; a sampler calls this on a few dozen values, where each numpy call costs more than the
    # arithmetic, so the range is read with two reductions rather than three passes of `where`.
    in_range = bool(xf.size) and xf.min() >= _EXP_UNDERFLOW and xf.max() <= _EXP_OVERFLOW  # False on NaN
    with np.errstate(all="ignore"):
        xd = xf.astype(np.float64)
        z = _INV_LN2_N * xd
        kd = z + _ROUND_SHIFT
        ki = kd.view(np.uint64)
        kd = kd - _ROUND_SHIFT
        r = z - kd
        index = (ki & np.uint64(_EXP_N - 1)).astype(np.intp)
        scale = (_exp_table()[index] + (ki << np.uint64(52 - _EXP_TABLE_BITS))).view(np.float64)
        c0, c1, c2 = _EXP_POLY
        y = (c0 * r + c1) * (r * r) + (c2 * r + 1.0)
        result = (y * scale).astype(np.float32)
        if in_range:
            return result
        result = np.where(xf > np.float32(_EXP_OVERFLOW), np.float32(np.inf), result)
        result = np.where(xf < np.float32(_EXP_UNDERFLOW), np.float32(0.0), result)
        result = np.where(np.isnan(xf), xf, result)
    return result.astype(np.float32, copy=False)


_FLOAT = struct.Struct("<f")
_DOUBLE = struct.Struct("<d")
_WORD = struct.Struct("<Q")


def round_f32(x: float) -> float:
    """`x` rounded to the nearest float32 (ties to even), as C's `(float)x`; beyond float32's range,
    an infinity of x's sign."""
    try:
        value: float = _FLOAT.unpack(_FLOAT.pack(x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)
    return value


@cache
def _exp_table_words() -> tuple[int, ...]:
    return tuple(int(word) for word in _exp_table())


def expf_scalar(x: float) -> float:
    """`expf` of one float32 value, as glibc computes it: `expf` above, one element, without numpy.

    Args:
        x: a float32 value, as a Python float.

    Returns:
        The float32 result, as a Python float.
    """
    if not x <= _EXP_OVERFLOW:  # above the range, or NaN
        return x if math.isnan(x) else math.inf
    if x < _EXP_UNDERFLOW:
        return 0.0
    z = _INV_LN2_N * x
    kd = z + _ROUND_SHIFT
    ki: int = _WORD.unpack(_DOUBLE.pack(kd))[0]
    kd -= _ROUND_SHIFT
    r = z - kd
    word = (_exp_table_words()[ki & (_EXP_N - 1)] + (ki << (52 - _EXP_TABLE_BITS))) & 0xFFFF_FFFF_FFFF_FFFF
    scale: float = _DOUBLE.unpack(_WORD.pack(word))[0]
    c0, c1, c2 = _EXP_POLY
    y = (c0 * r + c1) * (r * r) + (c2 * r + 1.0)
    return round_f32(y * scale)


def logf(x: F32 | np.float32 | float) -> F32:
    """`logf` of every element, as glibc computes it.

    Args:
        x: float32 values (a Python float is first rounded to float32, as C would).

    Returns:
        A float32 array of x's shape (0-d for a scalar).
    """
    xf = np.asarray(x, dtype=np.float32)
    with np.errstate(all="ignore"):
        ix = xf.view(np.uint32).astype(np.int64)
        # Subnormals: scale by 2^23 (exact) and take 23 back off the exponent.
        subnormal = (ix > 0) & (ix < _F32_MIN_NORMAL_BITS)
        scaled = (xf * np.float32(2.0**23)).view(np.uint32).astype(np.int64) - (23 << 23)
        ix = np.where(subnormal, scaled, ix)
        tmp = (ix - _LOG_OFF) & 0xFFFFFFFF
        i = (tmp >> (23 - 4)) % 16
        k = ((tmp ^ 0x80000000) - 0x80000000) >> 23  # arithmetic shift of the int32 reading
        iz = (ix - (tmp & (0x1FF << 23))) & 0xFFFFFFFF
        z = iz.astype(np.uint32).view(np.float32).astype(np.float64)
        r = z * _LOG_INVC[i] - 1.0
        y0 = _LOG_LOGC[i] + k.astype(np.float64) * _LN2
        r2 = r * r
        a0, a1, a2 = _LOG_POLY
        y = (a0 * r2 + (a1 * r + a2)) * r2 + (y0 + r)
        result = y.astype(np.float32)
        bits = xf.view(np.uint32).astype(np.int64)
        result = np.where(bits == _F32_ONE_BITS, np.float32(0.0), result)
        result = np.where((bits & 0x7FFFFFFF) == 0, np.float32(-np.inf), result)
        result = np.where(bits == _F32_INF_BITS, np.float32(np.inf), result)
        invalid = ((bits & 0x80000000) != 0) & ((bits & 0x7FFFFFFF) != 0)
        invalid |= np.isnan(xf)
        result = np.where(invalid, np.float32(np.nan), result)
    return result.astype(np.float32, copy=False)


@cache
def _c_powf() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).powf
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_float
    function.argtypes = (ctypes.c_float, ctypes.c_float)
    return function


def powf(base: float, exponent: float) -> np.float32:
    """The C library's `powf` of two float32 values (correctly rounded from double where there is none)."""
    function = _c_powf()
    b, e = np.float32(base), np.float32(exponent)
    if function is None:
        with np.errstate(all="ignore"):
            return np.float32(np.power(np.float64(b), np.float64(e)))
    return np.float32(function(float(b), float(e)))
