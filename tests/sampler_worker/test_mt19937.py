"""sampler_worker.mt19937: std::mt19937 and libstdc++'s uniform doubles, draw for draw."""

from __future__ import annotations

import math

import pytest

from sampler_worker.mt19937 import LLAMA_DEFAULT_SEED, MT19937, canonical_double, resolve_seed
from tests.sampler_worker.conftest import LibStdCxx

# The C++ standard, [rand.predef]: "The 10000th consecutive invocation of a default-constructed object
# of type mt19937 shall produce the value 4123659995." A default-constructed engine has seed 5489.
STANDARD_DEFAULT_SEED = 5489
STANDARD_10000TH_OUTPUT = 4123659995

SEEDS = [0, 1, 42, 5489, 1234567, 2**31, 0xFFFFFFFE, 0xFFFFFFFF]


def test_ten_thousandth_output_is_the_standards() -> None:
    rng = MT19937(STANDARD_DEFAULT_SEED)
    rng.discard(9999)
    assert rng.next_u32() == STANDARD_10000TH_OUTPUT


def test_seed_is_taken_modulo_two_to_the_32() -> None:
    a, b = MT19937(7), MT19937(2**32 + 7)
    assert [a.next_u32() for _ in range(5)] == [b.next_u32() for _ in range(5)]


def test_uniform_consumes_two_words_low_word_first() -> None:
    words, doubles = MT19937(99), MT19937(99)
    for _ in range(100):
        low, high = words.next_u32(), words.next_u32()
        assert doubles.uniform() == canonical_double(low, high)


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (0, 0, 0.0),
        (1, 0, 2.0**-64),
        (0, 1, 2.0**-32),
        (0, 0x80000000, 0.5),
        # low + high * 2**32 rounds up to 2**64: the quotient is 1.0 and is clamped below it
        (0xFFFFFFFF, 0xFFFFFFFF, math.nextafter(1.0, 0.0)),
        (0xFFFFFC01, 0xFFFFFFFF, math.nextafter(1.0, 0.0)),
    ],
    ids=["zero", "low-bit", "high-bit", "half", "clamped", "clamped-by-rounding"],
)
def test_canonical_double(low: int, high: int, expected: float) -> None:
    assert canonical_double(low, high) == expected


def test_canonical_double_is_below_one_without_clamping_short_of_rounding() -> None:
    value = canonical_double(0, 0xFFFFFFFF)  # (2**32 - 1) * 2**32 / 2**64 is exactly representable
    assert value == (2**32 - 1) / 2**32
    assert value < 1.0


def test_copy_continues_independently() -> None:
    rng = MT19937(3)
    rng.discard(10)
    twin = rng.copy()
    assert [rng.uniform() for _ in range(5)] == [twin.uniform() for _ in range(5)]
    rng.next_u32()
    assert rng.next_u32() != twin.next_u32()


def test_resolve_seed_keeps_a_given_seed() -> None:
    assert resolve_seed(12345) == 12345
    assert resolve_seed(2**32 + 5) == 5


@pytest.mark.parametrize("seed", [LLAMA_DEFAULT_SEED, -1], ids=["default-seed", "minus-one"])
def test_resolve_seed_draws_a_random_seed_for_the_default(seed: int) -> None:
    drawn = {resolve_seed(seed) for _ in range(8)}
    assert len(drawn) > 1
    assert all(0 <= value <= 0xFFFFFFFF for value in drawn)


@pytest.mark.oracle
@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed-{seed}" for seed in SEEDS])
def test_words_and_doubles_match_libstdcxx(seed: int, libstdcxx: LibStdCxx) -> None:
    count = 2000
    words, doubles = libstdcxx.run([f"words {seed} {count}", f"uniform {seed} {count}"])
    rng = MT19937(seed)
    assert [rng.next_u32() for _ in range(count)] == [int(word) for word in words]
    rng = MT19937(seed)
    assert [rng.uniform() for _ in range(count)] == [float.fromhex(value) for value in doubles]
