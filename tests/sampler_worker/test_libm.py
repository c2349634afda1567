"""sampler_worker.libm: expf and logf equal the C library's, bit for bit (glibc, as llama.cpp links)."""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import numpy.typing as npt
import pytest

from sampler_worker.libm import expf, expf_scalar, logf, powf, round_f32

# Sizes: 100,000 random bit patterns (every sign, exponent, NaN payload, subnormal) plus 100,000 values
# spread over the range the samplers use (exp: [-110, 90]; log: (0, 1]), plus the special values.
RANDOM_PATTERNS = 100_000
SPREAD = 100_000
SPECIALS = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-45, 1e-38, 88.72, 88.73, 89.0, -87.3, -103.9, -104.0,
     3.4e38, -3.4e38, 0.5, 2.0],
    dtype=np.float32,
)


def _c_function(name: str) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    library = ctypes.util.find_library("m")
    assert library is not None, "the C math library is needed"
    function = getattr(ctypes.CDLL(library), name)
    function.restype = ctypes.c_float
    function.argtypes = (ctypes.c_float,)
    return function


def _inputs(low: float, high: float) -> npt.NDArray[np.float32]:
    rng = np.random.default_rng(2024)
    words = rng.integers(0, 2**32, size=RANDOM_PATTERNS, dtype=np.uint64).astype(np.uint32)
    patterns = words.view(np.float32)
    spread = rng.uniform(low, high, size=SPREAD).astype(np.float32)
    return np.concatenate([SPECIALS, patterns, spread])


def _same_bits(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize(
    ("name", "ours", "low", "high"),
    [("expf", expf, -110.0, 90.0), ("logf", logf, 0.0, 1.0)],
    ids=["expf", "logf"],
)
def test_matches_the_c_library(name: str, ours: object, low: float, high: float) -> None:
    x = _inputs(low, high)
    c_function = _c_function(name)
    expected = np.fromiter((c_function(float(v)) for v in x), dtype=np.float32, count=x.size)
    got = ours(x)  # type: ignore[operator]
    differing = np.flatnonzero(~_same_bits(got, expected))
    assert differing.size == 0, f"{differing.size} differ, first at x={x[differing[0]]!r}"


def test_scalars_give_zero_dimensional_float32() -> None:
    assert expf(0.0).dtype == np.float32
    assert float(expf(0.0)) == 1.0
    assert float(logf(1.0)) == 0.0


def test_powf_rounds_to_float32() -> None:
    assert powf(2.0, 10.0) == np.float32(1024.0)
    assert powf(0.5, 0.5) == np.float32(np.sqrt(np.float32(0.5)))


def test_expf_of_values_all_in_range_matches_the_c_library() -> None:
    # The path a sampler's softmax takes: a few dozen values, none overflowing, underflowing or NaN, so no
    # special case is patched in (the whole-array test above always holds some, and takes the other path).
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.uniform(-103.9, 88.7, size=20_000), rng.normal(scale=4.0, size=20_000)])
    x = x.astype(np.float32)
    c_expf = _c_function("expf")
    for chunk in np.split(x, 1000):
        expected = np.array([c_expf(float(v)) for v in chunk], dtype=np.float32)
        got = expf(chunk)
        assert got.dtype == np.float32
        assert np.all(_same_bits(got, expected))


def test_expf_scalar_matches_the_c_library() -> None:
    # The whole test set of the array version above: every bit pattern class, the spread and the specials.
    x = _inputs(-110.0, 90.0)
    c_expf = _c_function("expf")
    expected = np.fromiter((c_expf(float(v)) for v in x), dtype=np.float32, count=x.size)
    got = np.array([expf_scalar(float(v)) for v in x], dtype=np.float64).astype(np.float32)
    differing = np.flatnonzero(~_same_bits(got, expected))
    assert differing.size == 0, f"{differing.size} differ, first at x={x[differing[0]]!r}"


def test_round_f32_is_the_float32_cast() -> None:
    rng = np.random.default_rng(11)
    x = np.concatenate([
        rng.normal(scale=1e3, size=20_000),
        rng.uniform(-1e-38, 1e-38, size=5_000),  # float32's subnormals
        [3.4028235677973366e38, 3.4028235677973362e38, -3.5e38, 1e300, 0.0, -0.0],
    ])
    with np.errstate(over="ignore"):
        expected = x.astype(np.float32)
    got = np.array([round_f32(float(v)) for v in x], dtype=np.float64).astype(np.float32)
    assert np.all(_same_bits(got, expected))
