# The random numbers of llama.cpp's `dist` sampler, draw for draw.
#
# Contract: `MT19937(seed)` yields the same 32-bit words as C++'s `std::mt19937(seed)`, and
# `uniform()` the same doubles as `std::uniform_real_distribution<double>(0, 1)` drawn from it
# with libstdc++ (the C++ library llama.cpp is built against on Linux). One `uniform()` consumes
# exactly two words, as libstdc++'s `generate_canonical<double, 53>` does, so a generator shared by
# several draws (llama-server's first draw and its masked redraw) stays in step with llama.cpp's.
#
# Invariants:
# - the state is the 624-word array of `std::mt19937` seeded with `seed` (Knuth's initialisation,
#   multiplier 1812433253), next index 624: exactly the standard engine after construction;
# - the twist and the tempering are CPython's `random.Random`, which is the same MT19937; we seed it
#   by writing the standard engine's state into it (`setstate`), never through its own seeding;
# - `resolve_seed(LLAMA_DEFAULT_SEED)` picks a random seed, as llama.cpp's `get_rng_seed` does.

from __future__ import annotations

import random
import secrets

__all__ = ["LLAMA_DEFAULT_SEED", "MT19937", "canonical_double", "resolve_seed"]

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
"""llama.cpp's "no seed given" value (`LLAMA_DEFAULT_SEED`): the sampler then seeds itself at random."""

_N = 624  # words of state
_MASK32 = 0xFFFFFFFF
_INIT_MULTIPLIER = 1812433253  # the standard's initialization_multiplier for mt19937
_TWO_POW_32 = 4294967296.0
_TWO_POW_64 = 18446744073709551616.0
# std::nextafter(1.0, 0.0): generate_canonical's clamp when rounding reached 1.0.
_BELOW_ONE = 1.0 - 2.0**-53


def resolve_seed(seed: int) -> int:
    """The seed a llama.cpp sampler actually uses for a requested seed.

    The request is taken as a C `uint32_t` (so -1 is `LLAMA_DEFAULT_SEED`, as llama-server reads it);
    `LLAMA_DEFAULT_SEED` means "random" and is replaced by 32 random bits from the operating system,
    as llama.cpp's `get_rng_seed` replaces it with `std::random_device()`.

    Args:
        seed: the requested seed, any integer.

    Returns:
        The 32-bit seed to give `MT19937`.
    """
    seed &= _MASK32
    if seed == LLAMA_DEFAULT_SEED:
        return secrets.randbits(32)
    return seed


def _seeded_state(seed: int) -> list[int]:
    state = [seed & _MASK32]
    previous = state[0]
    for i in range(1, _N):
        previous = (_INIT_MULTIPLIER * (previous ^ (previous >> 30)) + i) & _MASK32
        state.append(previous)
    return state


def canonical_double(low: int, high: int) -> float:
    """libstdc++'s `generate_canonical<double, 53>` from the two 32-bit words it draws, in draw order.

    The first word is the low half: `sum = low + high * 2**32` (rounded to a double), `sum / 2**64`,
    and a result that rounded up to 1.0 is clamped to the largest double below 1.0.

    Args:
        low: the first word drawn.
        high: the second word drawn.

    Returns:
        A double in [0, 1).
    """
    total = float(low) + float(high) * _TWO_POW_32
    result = total / _TWO_POW_64
    if result >= 1.0:
        return _BELOW_ONE
    return result


class MT19937:
    """`std::mt19937(seed)` and llama.cpp's uniform doubles drawn from it.

    Attributes:
        seed: the 32-bit seed the engine was constructed with.
    """

    __slots__ = ("_engine", "seed")

    def __init__(self, seed: int) -> None:
        """Construct the engine as `std::mt19937(seed)` does.

        Args:
            seed: taken modulo 2**32, as the C++ constructor takes its `result_type` argument.
                `LLAMA_DEFAULT_SEED` is an ordinary seed here: use `resolve_seed` for llama.cpp's
                "random seed" meaning.
        """
        self.seed = seed & _MASK32
        self._engine = random.Random()
        self._engine.setstate((3, (*_seeded_state(self.seed), _N), None))

    def next_u32(self) -> int:
        """The next 32-bit output (`operator()` of the C++ engine)."""
        return self._engine.getrandbits(32)

    def uniform(self) -> float:
        """The next `std::uniform_real_distribution<double>(0.0, 1.0)` draw; consumes two words."""
        low = self._engine.getrandbits(32)
        high = self._engine.getrandbits(32)
        return canonical_double(low, high)

    def discard(self, count: int) -> None:
        """Advance by `count` outputs, as `std::mt19937::discard` does."""
        for _ in range(count):
            self._engine.getrandbits(32)

    def copy(self) -> MT19937:
        """An independent engine in the same state (C++ copy construction)."""
        twin = MT19937.__new__(MT19937)
        twin.seed = self.seed
        twin._engine = random.Random()
        twin._engine.setstate(self._engine.getstate())
        return twin
