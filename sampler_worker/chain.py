# A sampler chain built as llama-server builds it, and its constrained draw.
#
# Contract:
# - `SamplerSettings()` holds llama-server's defaults (common_params_sampling): top-k 40, top-p 0.95,
#   min-p 0.05, typical-p 1.0 (off), temperature 0.8, penalties off (last 64 tokens), seed random.
# - `SamplerChain.from_settings` adds the samplers in llama-server's order (`common_sampler_init`):
#   logit bias (if any), then `settings.order` (penalties, dry, top-n-sigma, top-k, typical, top-p,
#   min-p, xtc, temperature by default), then dist. A sampler llama.cpp would create empty (its
#   setting means "off") is left out; it changes nothing either way.
# - `sample(logits)` is one `llama_sampler_apply` of the whole chain on every token of the vocabulary
#   (fresh candidates, unsorted) and returns the token id; `sample(logits, allowed=mask)` first sets
#   every token the mask rejects to -inf, which is what llama.cpp's grammar sampler does. The chain
#   keeps its generator between calls, so llama-server's `common_sampler_sample` with
#   `grammar_first = false` (draw; if the grammar rejects the token, mask and run the whole chain
#   again) is `sample(logits)` then, on rejection, `sample(logits, allowed=mask)`, or with the mask as
#   the allowed tokens' ids, `sample(logits, allowed_ids=ids)`: a redraw's mask allows few tokens, and
#   then neither the mask nor the logits are read whole.
# - A chain that begins with top-k reads what top-k leaves without copying or sorting the vocabulary:
#   a first draw takes the k highest logits when they are distinct and above the rest, where every
#   correct sort agrees (`fresh_top_k`; with ties there, the whole chain runs); a masked draw (k up to
#   128, llama.cpp's std::partial_sort) builds the candidates from the first k tokens and the allowed
#   ones past them (`masked_top_k`). The same candidates, in the same order, either way.
# - A masked redraw whose mask allows few tokens with distinct finite logits runs top-k's samplers on
#   those alone (the k highest, where they are more), as Python floats (`Sampler.apply_few`): the -inf
#   tail llama.cpp's top-k also keeps cannot change what they draw. Anything else (ties, many tokens, a
#   sampler the tail could move) runs as above.
# - `accept(token)` is `llama_sampler_accept` on the chain (the penalties remember the token); the
#   caller accepts each generated token once, after the draw that chose it.

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sampler_worker.candidates import Candidates
from sampler_worker.mt19937 import LLAMA_DEFAULT_SEED
from sampler_worker.penalties import LogitBias, Penalties
from sampler_worker.samplers import (
    PARTIAL_SORT_HEAP_LIMIT,
    Dist,
    MinP,
    Sampler,
    Temperature,
    TopK,
    TopP,
    Typical,
    fresh_top_k,
    masked_top_k,
)

__all__ = ["DEFAULT_ORDER", "SamplerChain", "SamplerSettings"]

# A masked redraw whose mask allows at most this many tokens runs its samplers on their logits as Python
# floats (`_sample_few`): about 2 µs a candidate (top-p's and dist's `expf`), against about 250 µs of the
# chain's numpy calls on any number. A redraw's mask allows a median of 4 tokens; past 64 the numpy calls
# win.
_FEW_CANDIDATES = 64

DEFAULT_ORDER = (
    "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature",
)
"""llama-server's default sampler order (common_params_sampling::samplers), by llama.cpp's names."""


@dataclass(frozen=True, slots=True)
class SamplerSettings:
    """The sampling parameters of one generation, with llama-server's defaults.

    Attributes:
        seed: the dist sampler's seed; `LLAMA_DEFAULT_SEED` (or -1) for a random one.
        top_k: keep the k most likely tokens; <= 0 keeps all.
        top_p: nucleus threshold; 1.0 is off.
        min_p: minimum probability relative to the top one; 0.0 is off.
        typical_p: locally typical sampling; 1.0 is off.
        temperature: divide logits by it; <= 0 keeps only the most likely token.
        dynatemp_range: dynamic temperature range around `temperature`; 0.0 is off.
        dynatemp_exponent: dynamic temperature exponent.
        penalty_last_n: how many recent tokens the penalties look at; 0 is off.
        repeat_penalty: 1.0 is off.
        frequency_penalty: 0.0 is off.
        presence_penalty: 0.0 is off.
        min_keep: keep at least this many candidates in top-p, min-p and typical (0: no minimum).
        logit_bias: (token, bias) pairs added to the logits first; -inf bans a token.
        order: the order of the samplers, by llama.cpp's names (see `DEFAULT_ORDER`).
        dry_multiplier: DRY is not supported; only 0.0 (off) is accepted.
        xtc_probability: XTC is not supported; only 0.0 (off) is accepted.
        top_n_sigma: top-n-sigma is not supported; only values <= 0 (off) are accepted.
        mirostat: mirostat is not supported; only 0 (off) is accepted.
    """

    seed: int = LLAMA_DEFAULT_SEED
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    temperature: float = 0.8
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    penalty_last_n: int = 64
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_keep: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    order: tuple[str, ...] = DEFAULT_ORDER
    dry_multiplier: float = 0.0
    xtc_probability: float = 0.0
    top_n_sigma: float = -1.0
    mirostat: int = 0

    def check(self) -> None:
        """Refuse what llama-server refuses, and what this port does not implement.

        Raises:
            ValueError: a penalty is not finite or the repeat penalty is not positive (as
                `common_sampler_init` throws), an unknown sampler name is in `order`, or a sampler
                that is not ported (DRY, XTC, top-n-sigma, mirostat) is turned on.
        """
        repeat = np.float32(self.repeat_penalty)
        with np.errstate(all="ignore"):
            inverse = np.float32(1.0) / repeat
        if not math.isfinite(repeat) or repeat <= 0.0 or not math.isfinite(inverse):
            raise ValueError("penalty_repeat must be finite and greater than 0")
        if not math.isfinite(self.frequency_penalty):
            raise ValueError("penalty_freq must be finite")
        if not math.isfinite(self.presence_penalty):
            raise ValueError("penalty_present must be finite")
        unknown = [name for name in self.order if name not in DEFAULT_ORDER]
        if unknown:
            raise ValueError(f"unknown sampler {unknown[0]!r}; known: {', '.join(DEFAULT_ORDER)}")
        unported = {
            "dry_multiplier": self.dry_multiplier != 0.0,
            "xtc_probability": self.xtc_probability > 0.0 and "xtc" in self.order,
            "top_n_sigma": self.top_n_sigma > 0.0 and "top_n_sigma" in self.order,
            "mirostat": self.mirostat != 0,
        }
        for setting, on in unported.items():
            if on:
                raise ValueError(f"{setting} selects a sampler this worker does not implement")


def _sampler_for(name: str, settings: SamplerSettings) -> Sampler | None:
    # One entry per llama.cpp sampler type; None where llama.cpp would add an empty sampler.
    s = settings
    if name == "penalties":
        penalties = Penalties(s.penalty_last_n, s.repeat_penalty, s.frequency_penalty, s.presence_penalty)
        return None if penalties.disabled else penalties
    if name == "top_k":
        return TopK(s.top_k) if s.top_k > 0 else None
    if name == "typ_p":
        return Typical(s.typical_p, s.min_keep) if np.float32(s.typical_p) < 1.0 else None
    if name == "top_p":
        return TopP(s.top_p, s.min_keep) if np.float32(s.top_p) < 1.0 else None
    if name == "min_p":
        return MinP(s.min_p, s.min_keep) if np.float32(s.min_p) > 0.0 else None
    if name == "temperature":
        off = np.float32(s.temperature) == 1.0 and np.float32(s.dynatemp_range) <= 0.0
        return None if off else Temperature(s.temperature, s.dynatemp_range, s.dynatemp_exponent)
    return None  # dry, top_n_sigma, xtc: off (check() refused them on)


class SamplerChain:
    """An ordered list of samplers applied as one (llama.cpp's sampler chain).

    Attributes:
        samplers: the samplers, in order; the last one selects.
    """

    __slots__ = ("_first_top_k", "samplers")

    def __init__(self, samplers: Sequence[Sampler]) -> None:
        self.samplers = tuple(samplers)
        first = self.samplers[0] if self.samplers else None
        self._first_top_k = first.k if isinstance(first, TopK) and first.k > 0 else 0

    @classmethod
    def from_settings(cls, settings: SamplerSettings | None = None) -> SamplerChain:
        """The chain llama-server builds for these settings (`common_sampler_init`, mirostat off).

        Args:
            settings: the sampling parameters; llama-server's defaults when None.

        Returns:
            A chain ending in a dist sampler seeded with `settings.seed`.

        Raises:
            ValueError: see `SamplerSettings.check`.
        """
        settings = settings or SamplerSettings()
        settings.check()
        samplers: list[Sampler] = []
        if settings.logit_bias:
            samplers.append(LogitBias(settings.logit_bias))
        for name in settings.order:
            sampler = _sampler_for(name, settings)
            if sampler is not None:
                samplers.append(sampler)
        samplers.append(Dist(settings.seed))
        return cls(samplers)

    @property
    def seed(self) -> int | None:
        """The seed the chain's dist sampler actually uses (a random seed resolved), if it has one."""
        for sampler in self.samplers:
            if isinstance(sampler, Dist):
                return sampler.seed_used
        return None

    def apply(self, cur: Candidates) -> None:
        """Apply every sampler in order (llama_sampler_apply on the chain)."""
        for sampler in self.samplers:
            sampler.apply(cur)

    def sample(
        self,
        logits: npt.ArrayLike,
        *,
        allowed: npt.NDArray[np.bool_] | None = None,
        allowed_ids: npt.NDArray[np.integer] | None = None,
    ) -> int:
        """Run the whole chain on one step's logits and return the token it selects.

        Does not accept the token: call `accept` once the token is final.

        Args:
            logits: one logit per vocabulary token.
            allowed: if given, one bool per token; tokens it rejects get logit -inf first (a masked
                redraw after a grammar rejection).
            allowed_ids: the same mask as the allowed tokens' ids, ascending (`allowed_tokens` of the
                packed mask): a redraw then reads only those tokens' logits and the first top-k's. The
                logits of the tokens the mask rejects are not looked at (llama.cpp's grammar sampler
                overwrites them); the first draw on the same logits checked them all.

        Returns:
            The selected token id.

        Raises:
            ValueError: a logit is NaN or +inf (llama.cpp's result would be meaningless), nothing could
                be selected, the mask does not fit the logits, or both forms of the mask are given.
        """
        values = np.asarray(logits, dtype=np.float32).reshape(-1)
        if allowed_ids is not None:
            if allowed is not None:
                raise ValueError("a mask as bools or as ids, not both")
            return self._sample_allowed_ids(values, np.asarray(allowed_ids).reshape(-1))
        highest = values.max() if values.size else np.float32(0.0)
        if np.isnan(highest) or highest == np.inf:  # the max of an array holding a NaN is NaN
            raise ValueError("logits must be finite or -inf")
        if allowed is None:
            top = fresh_top_k(values, self._first_top_k) if self._first_top_k else None
            if top is None:
                cur = Candidates.from_logits(values)
                self.apply(cur)
                return cur.token
            for sampler in self.samplers[1:]:
                sampler.apply(top)
            return top.token
        if allowed.shape != values.shape:
            raise ValueError(f"mask has {allowed.size} entries for {values.size} logits")
        top = (masked_top_k(values, np.flatnonzero(allowed), self._first_top_k)
               if self._first_top_k else None)
        if top is None:
            cur = Candidates.from_logits(values)
            cur.logits[~allowed] = -np.inf
            self.apply(cur)
        else:
            cur = top
            for sampler in self.samplers[1:]:
                sampler.apply(cur)
        return cur.token

    def _sample_allowed_ids(self, values: npt.NDArray[np.float32], ids: npt.NDArray[np.integer]) -> int:
        if ids.size and (ids[0] < 0 or ids[-1] >= values.size):
            raise ValueError(f"a mask of token ids up to {int(ids[-1])} for {values.size} logits")
        if 0 < ids.size <= _FEW_CANDIDATES and 0 < self._first_top_k <= PARTIAL_SORT_HEAP_LIMIT:
            token = self._sample_few(values[ids].tolist(), ids)
            if token is not None:
                return token
        read = values[ids]
        if np.isnan(read).any() or (read == np.inf).any():
            raise ValueError("logits must be finite or -inf")
        top = masked_top_k(values, ids, self._first_top_k) if self._first_top_k else None
        if top is None:  # no top-k first, or one that sorts by buckets: the whole masked vocabulary
            cur = Candidates.from_logits(values)
            kept = cur.logits[ids]
            cur.logits[:] = -np.inf
            cur.logits[ids] = kept
            self.apply(cur)
            return cur.token
        for sampler in self.samplers[1:]:
            sampler.apply(top)
        return top.token

    def _sample_few(self, read: list[float], ids: npt.NDArray[np.integer]) -> int | None:
        # What top-k (k <= 128, a comparison sort) leaves of the masked vocabulary is the allowed tokens'
        # finite logits, highest first, then a tail of -inf (samplers.py's comment on few candidates), or
        # the k highest of them where they are more: where those logits are distinct, every comparison
        # sort agrees on their order, and the samplers after top-k run on them alone as Python floats.
        # None where they are not, or a sampler has no such form (nothing drawn then). (Past 128,
        # llama.cpp's buckets are no comparison sort: a logit past about 3e8 overflows its bucket index
        # and sorts last.) `read`: the allowed tokens' logits, in the order of `ids`.
        if any(logit != logit or logit == math.inf for logit in read):  # NaN, +inf
            raise ValueError("logits must be finite or -inf")
        finite = [(logit, at) for at, logit in enumerate(read) if logit != -math.inf]
        if not finite or len({logit for logit, _ in finite}) < len(finite):
            return None
        last = self.samplers[-1]
        if not isinstance(last, Dist):
            return None
        finite.sort(reverse=True)  # by logit alone: they are distinct
        del finite[self._first_top_k :]
        head = [logit for logit, _ in finite]
        for sampler in self.samplers[1:-1]:
            kept = sampler.apply_few(head)
            if kept is None:
                return None
            head = kept
        return int(ids[finite[last.select_few(head)][1]])

    def accept(self, token: int) -> None:
        """Tell every sampler `token` was chosen (llama_sampler_accept on the chain)."""
        for sampler in self.samplers:
            sampler.accept(token)

    def reset(self) -> None:
        """Reset every sampler (a random seed is drawn again)."""
        for sampler in self.samplers:
            sampler.reset()

