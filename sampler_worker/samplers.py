# llama.cpp's samplers (src/llama-sampler.cpp), each a port of its `apply` and `accept`.
#
# Contract: for the same candidates (ids, logits, order, sorted flag) and the same state, each
# sampler's `apply` leaves the candidates exactly as llama.cpp's leaves its `llama_token_data_array`:
# the same candidates in the same order, the same float32 logits and probabilities, the same sorted
# flag, and (for greedy and dist) the same selected position, drawing from the generator exactly as
# llama.cpp does. Floating-point work is done in the precision llama.cpp uses (float32 sums are
# sequential float32 sums, `expf`/`logf` are the C library's), because a top-p cut or a cumulative
# draw can turn on the last bit.
#
# Few candidates: `apply_few(logits)` is the same sampler on a sorted head of distinct finite logits held
# as Python floats, what a masked redraw leaves top-k besides its -inf tail (the first k tokens the
# mask rejects), where the numpy calls cost far more than their arithmetic. For top-p, min-p, plain
# temperature and dist the tail changes nothing that comes out: its probabilities are exactly 0, so
# every sum and cut over the head is the same with or without it, and dist never stops on a 0 (the
# running sum reached its target at an earlier candidate). A sampler whose result the tail changes
# (typical's entropy, dynamic temperature's maximum entropy) has no such form: `apply_few` returns None
# and the caller runs the whole chain. float32 arithmetic is a double operation rounded with
# `round_f32` (libm.py).
#
# Not ported: DRY, XTC, top-n-sigma, mirostat, adaptive-p, infill (llama-server leaves all of them
# off unless asked; the chain refuses settings that turn them on).

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from sampler_worker.candidates import Candidates
from sampler_worker.cxx_sort import (
    bucket_partial_order,
    bucket_value_order,
    largest_unique,
    partial_sort_order,
    sort_order,
)
from sampler_worker.libm import expf, expf_scalar, logf, powf, round_f32
from sampler_worker.mt19937 import MT19937, resolve_seed

__all__ = [
    "PARTIAL_SORT_HEAP_LIMIT",
    "Dist",
    "Greedy",
    "MinP",
    "Sampler",
    "Temperature",
    "TopK",
    "TopP",
    "Typical",
    "fresh_top_k",
    "masked_top_k",
    "partial_sort_inplace",
    "softmax",
]

_F32 = np.float32
PARTIAL_SORT_HEAP_LIMIT = 128  # up to this many, llama.cpp uses std::partial_sort; above, its buckets
_TOP_P_ADAPTIVE_ABOVE = 1024  # top-p sorts only its first 256 when there are more candidates than this
_TOP_P_FIRST_SORT = 256


class Sampler:
    """A step of a sampler chain: `apply` to candidates, `accept` each token the chain chose."""

    name = "sampler"

    def apply(self, cur: Candidates) -> None:
        """Transform the candidates in place (llama_sampler_apply)."""
        raise NotImplementedError

    def accept(self, token: int) -> None:
        """Note that `token` was chosen (llama_sampler_accept); most samplers keep no state."""

    def reset(self) -> None:
        """Forget what `accept` recorded (llama_sampler_reset)."""

    def apply_few(self, logits: list[float]) -> list[float] | None:
        """`apply` on sorted candidates given as their distinct finite logits, highest first, and a tail
        of -inf ones left out (see the module comment): the head it leaves, or None where the tail
        could change the result or this sampler has no such form."""
        return None


def partial_sort_inplace(cur: Candidates, npartial: int) -> None:
    """llama.cpp's `llama_token_data_array_partial_sort_inplace`: keep the top `npartial`, sorted."""
    if npartial <= PARTIAL_SORT_HEAP_LIMIT:
        order = partial_sort_order(-cur.logits, npartial)
    else:
        order = bucket_partial_order(cur.logits, npartial)
    cur.take(order, is_sorted=True)


def _max_logit(cur: Candidates) -> np.float32:
    return np.float32(cur.logits[0] if cur.is_sorted else cur.logits.max())


def softmax(cur: Candidates, *, do_sort: bool) -> None:
    """llama.cpp's `llama_sampler_softmax_impl`: probabilities from logits, optionally sorting first."""
    if do_sort and not cur.is_sorted:
        partial_sort_inplace(cur, len(cur))
    with np.errstate(all="ignore"):
        p = expf(cur.logits - _max_logit(cur))
        total = np.cumsum(p, dtype=_F32)[-1]
        cur.probs = (p / total).astype(_F32, copy=False)


# `_softmax_few` works one candidate at a time up to this many (about 2 µs each); past it, numpy's calls
# (about 25 µs for any number) cost less
_SCALAR_SOFTMAX = 16


def _softmax_few(logits: list[float]) -> list[float]:
    # `softmax` of sorted candidates: expf(l - max), a sequential float32 sum; one float32 at a time, or
    # as `softmax` does on an array past _SCALAR_SOFTMAX of them
    if len(logits) > _SCALAR_SOFTMAX:
        with np.errstate(all="ignore"):
            values = np.array(logits, dtype=_F32)
            exps = expf(values - values[0])
            probs: list[float] = (exps / np.cumsum(exps, dtype=_F32)[-1]).astype(_F32, copy=False).tolist()
        return probs
    top = logits[0]
    p = [expf_scalar(round_f32(logit - top)) for logit in logits]
    total = 0.0
    for value in p:
        total = round_f32(total + value)
    return [round_f32(value / total) for value in p]


def _sequential_sum(values: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    # The running float32 sum a C loop `sum += v[i]` produces (numpy's accumulate is sequential).
    return np.cumsum(values, dtype=_F32)


class TopK(Sampler):
    """`llama_sampler_init_top_k(k)`: keep the k highest logits, sorted. k <= 0 keeps all."""

    name = "top-k"

    def __init__(self, k: int) -> None:
        self.k = k

    def apply(self, cur: Candidates) -> None:
        if self.k <= 0:
            return
        k = min(self.k, len(cur))
        if not cur.is_sorted:
            partial_sort_inplace(cur, k)
        cur.truncate(k)


def fresh_top_k(logits: npt.NDArray[np.float32], k: int) -> Candidates | None:
    """What `TopK(k)` leaves of fresh candidates (every token, unsorted), without copying the vocabulary;
    None when the k highest logits are not all distinct and above the rest.

    Where they are, every correct sort puts the same tokens first in the same order, llama.cpp's
    `std::partial_sort` (k <= 128) and its buckets alike, so reading them off the logits is exact. Where
    they are not (ties at or above the cut), the order is the algorithm's, and the caller runs it.

    Args:
        logits: one logit per vocabulary token, no NaN (not modified).
        k: top-k's k, 0 < k.
    """
    if k >= logits.size:
        return None
    order = largest_unique(logits, k)
    if order is None:
        return None
    return Candidates(order.astype(np.int32), logits[order], is_sorted=True)


def masked_top_k(
    logits: npt.NDArray[np.float32], allowed_ids: npt.NDArray[np.integer], k: int
) -> Candidates | None:
    """What `TopK(k)` leaves of fresh candidates whose rejected tokens were set to -inf; None for k > 128.

    llama.cpp's top-k with k <= 128 is `std::partial_sort`, whose heap takes the first k elements and
    then lets in only an element that compares above its top: a rejected token past the first k (-inf)
    never enters, so the sort over the first k tokens and the allowed tokens past them, in vocabulary
    order, leaves exactly what the sort over the whole masked vocabulary leaves, ties and -inf included.
    (Larger k sorts by buckets, where this does not hold.)

    Args:
        logits: one logit per vocabulary token (not modified).
        allowed_ids: the allowed tokens' ids, ascending, each below `logits.size`.
        k: top-k's k, 0 < k.
    """
    if k > PARTIAL_SORT_HEAP_LIMIT:
        return None
    k = min(k, logits.size)
    split = int(np.searchsorted(allowed_ids, k))
    positions = np.concatenate((np.arange(k, dtype=np.intp), allowed_ids[split:]))
    values = logits[positions]
    rejected_first = np.ones(k, dtype=np.bool_)
    rejected_first[allowed_ids[:split]] = False
    values[:k][rejected_first] = -np.inf
    order = partial_sort_order(-values, k)
    return Candidates(positions[order].astype(np.int32), values[order], is_sorted=True)


class TopP(Sampler):
    """`llama_sampler_init_top_p(p, min_keep)`: the smallest prefix whose probability reaches p."""

    name = "top-p"

    def __init__(self, p: float, min_keep: int = 0) -> None:
        self.p = _F32(p)
        self.min_keep = min_keep
        self._p_float = float(self.p)  # the few-candidate form compares Python floats

    def apply_few(self, logits: list[float]) -> list[float] | None:
        if self.p >= 1.0:
            return logits
        running = 0.0
        for i, prob in enumerate(_softmax_few(logits)):
            running = round_f32(running + prob)
            if running >= self._p_float and i + 1 >= self.min_keep:
                return logits[: i + 1]
        return logits

    def _cut(self, probs: npt.NDArray[np.float32]) -> int | None:
        # First i with cum_sum >= p and i + 1 >= min_keep: the prefix kept is i + 1 long.
        reached = (_sequential_sum(probs) >= self.p) & (np.arange(1, probs.size + 1) >= self.min_keep)
        hits = np.flatnonzero(reached)
        return int(hits[0]) + 1 if hits.size else None

    def apply(self, cur: Candidates) -> None:
        if self.p >= 1.0:
            return
        softmax(cur, do_sort=False)
        size = len(cur)
        if not cur.is_sorted and size > _TOP_P_ADAPTIVE_ABOVE:
            # Sort only the first 256 (into a side buffer); sort all only if those do not reach p.
            # Both sorts agree on the values in the first 256 positions (ties have equal
            # probabilities), so the running sum over them is the same either way.
            first = bucket_partial_order(cur.logits, min(_TOP_P_FIRST_SORT, size))
            last = self._cut(cur.probs[first])
            if last is None:
                # The cut depends only on the sequence of values, not on the order among equal ones;
                # then only the buckets reaching into the kept prefix need llama.cpp's exact order.
                by_value = bucket_value_order(cur.logits)
                last = self._cut(cur.probs[by_value]) or size
                order = bucket_partial_order(cur.logits, size, needed=last)
            else:
                order = first
            cur.take(order[:last], is_sorted=True)
            return
        if not cur.is_sorted:
            partial_sort_inplace(cur, size)
        cur.truncate(self._cut(cur.probs) or size)


class MinP(Sampler):
    """`llama_sampler_init_min_p(p, min_keep)`: drop tokens below p times the top probability."""

    name = "min-p"

    def __init__(self, p: float, min_keep: int = 0) -> None:
        self.p = _F32(p)
        self.min_keep = min_keep
        self._log_p = logf(self.p)  # once: `logf` is dozens of numpy calls (unused for p <= 0)
        self._log_p_float = float(self._log_p)

    def apply_few(self, logits: list[float]) -> list[float] | None:
        if self.p <= 0.0:
            return logits
        bar = round_f32(logits[0] + self._log_p_float)
        for i in range(max(1, self.min_keep), len(logits)):
            if logits[i] < bar:
                return logits[:i]
        return logits

    def apply(self, cur: Candidates) -> None:
        if self.p <= 0.0 or not len(cur):
            return
        if not cur.is_sorted:
            # max starts at -FLT_MAX, so an all -inf array gives -FLT_MAX here, as in llama.cpp
            max_logit = max(_F32(-np.finfo(_F32).max), cur.logits.max())
            min_logit = _F32(max_logit + self._log_p)
            kept = np.flatnonzero(cur.logits >= min_logit)
            if kept.size and kept.size >= self.min_keep:
                cur.take(kept)
                return
            partial_sort_inplace(cur, len(cur))
        min_logit = _F32(cur.logits[0] + self._log_p)
        # the first token always stays; stop at the first one below the bar once min_keep are kept
        below = (cur.logits < min_logit) & (np.arange(len(cur)) >= self.min_keep)
        below[0] = False
        stops = np.flatnonzero(below)
        cur.truncate(int(stops[0]) if stops.size else len(cur))


class Typical(Sampler):
    """`llama_sampler_init_typical(p, min_keep)`: locally typical sampling."""

    name = "typical"

    def __init__(self, p: float, min_keep: int = 0) -> None:
        self.p = _F32(p)
        self.min_keep = min_keep

    def apply(self, cur: Candidates) -> None:
        if self.p >= 1.0:
            return
        softmax(cur, do_sort=True)
        with np.errstate(all="ignore"):
            log_probs = logf(cur.probs)
            entropy = _sequential_sum(-cur.probs * log_probs)[-1]
            shifted = np.abs(-log_probs - entropy)
        order = sort_order(shifted)
        cumulative = _sequential_sum(cur.probs[order])
        enough = np.arange(order.size) >= self.min_keep - 1 if self.min_keep else np.ones(order.size, bool)
        hits = np.flatnonzero((cumulative > self.p) & enough)
        last = int(hits[0]) + 1 if hits.size else order.size
        cur.take(order[:last], is_sorted=False)


class Temperature(Sampler):
    """`llama_sampler_init_temp_ext(t, delta, exponent)` (plain temperature when delta <= 0)."""

    name = "temp-ext"

    def __init__(self, temperature: float, delta: float = 0.0, exponent: float = 1.0) -> None:
        self.temperature = _F32(temperature)
        self.delta = _F32(delta)
        self.exponent = _F32(exponent)
        self._temperature_float = float(self.temperature)

    @staticmethod
    def scale(cur: Candidates, temperature: np.float32) -> None:
        """llama.cpp's `llama_sampler_temp_impl`: divide by t, or keep only the first maximum if t <= 0."""
        if not len(cur):
            return
        if temperature <= 0.0:
            best = int(np.argmax(cur.logits))  # the first of equal maxima, as the strict `>` scan keeps
            keep = cur.logits[best]
            cur.logits = np.full_like(cur.logits, -np.inf)
            cur.logits[best] = keep
            return
        cur.logits = (cur.logits / temperature).astype(_F32, copy=False)

    def apply_few(self, logits: list[float]) -> list[float] | None:
        if self.delta > 0.0:  # the entropy's maximum counts the tail
            return None
        if self.temperature <= 0.0:
            return logits[:1]  # the first maximum: the head is sorted and distinct
        temperature = self._temperature_float
        scaled = [round_f32(logit / temperature) for logit in logits]
        return scaled if math.isfinite(scaled[0]) and math.isfinite(scaled[-1]) else None

    def apply(self, cur: Candidates) -> None:
        if self.delta <= 0.0:
            self.scale(cur, self.temperature)
            return
        if len(cur) <= 1:
            return
        min_temp = max(_F32(0.0), _F32(self.temperature - self.delta))
        max_temp = _F32(self.temperature + self.delta)
        max_entropy = -logf(_F32(1.0) / _F32(len(cur)))
        softmax(cur, do_sort=True)
        with np.errstate(all="ignore"):
            positive = cur.probs[cur.probs > 0.0]
            # `entropy -= p * logf(p)` over p > 0: IEEE a - b is a + (-b), so a running sum of the
            # negated terms gives the same bits.
            terms = -(positive * logf(positive))
            entropy = _sequential_sum(terms)[-1] if terms.size else _F32(0.0)
            normalized = _F32(entropy / max_entropy)
            shaped = powf(float(normalized), float(self.exponent))
            dynamic = _F32(min_temp + _F32((max_temp - min_temp) * shaped))
        self.scale(cur, dynamic)
        with np.errstate(all="ignore"):
            p = np.exp(cur.logits.astype(np.float64) - np.float64(cur.logits[0]))
            total = np.cumsum(p)[-1]
            cur.probs = (p.astype(_F32).astype(np.float64) / total).astype(_F32)


class Greedy(Sampler):
    """`llama_sampler_init_greedy()`: select the first candidate with the highest logit."""

    name = "greedy"

    def apply(self, cur: Candidates) -> None:
        cur.selected = int(np.argmax(cur.logits)) if len(cur) else 0


class Dist(Sampler):
    """`llama_sampler_init_dist(seed)`: draw from the softmax with an mt19937 seeded `seed`.

    Attributes:
        seed: the requested seed (`LLAMA_DEFAULT_SEED` for a random one).
        seed_used: the seed the generator was built with (llama_sampler_get_seed).
    """

    name = "dist"

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.seed_used = resolve_seed(seed)
        self.rng = MT19937(self.seed_used)

    def reset(self) -> None:
        self.seed_used = resolve_seed(self.seed)
        self.rng = MT19937(self.seed_used)

    def select_few(self, logits: list[float]) -> int:
        """`apply` on a sorted head of distinct finite logits (see the module comment): the position it
        selects, drawing from the generator as `apply` does."""
        if len(logits) == 1:
            self.rng.uniform()
            return 0
        top = logits[0]
        running: list[float] = []
        total = 0.0
        for logit in logits:
            total += expf_scalar(round_f32(logit - top))  # `double sum += float p`, in order
            running.append(total)
        target = total * self.rng.uniform()
        for position, reached in enumerate(running):
            if reached >= target:
                return position
        return len(logits) - 1

    def apply(self, cur: Candidates) -> None:
        size = len(cur)
        if size == 0:
            cur.selected = -1
            return
        cur.selected = 0
        if size == 1:
            self.rng.uniform()  # llama.cpp draws once even then, to stay aligned
            cur.probs = np.ones(1, dtype=_F32)
            return
        with np.errstate(all="ignore"):
            p = expf(cur.logits - _max_logit(cur)).astype(np.float64)
            running = np.cumsum(p)  # `double sum += float p`, in order
            total = float(running[-1])
            target = total * self.rng.uniform()
            reached = np.flatnonzero(running >= target)
            cur.selected = int(reached[0]) if reached.size else size - 1
            cur.probs = (p / total).astype(_F32)
