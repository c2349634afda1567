# The samplers that adjust logits without cutting candidates: repetition penalties and logit bias.
#
# Contract (as llama.cpp's `llama_sampler_init_penalties` and `llama_sampler_init_logit_bias`):
# - Penalties remember the last `last_n` accepted tokens (a ring buffer; llama-server feeds it the
#   prompt too). For each candidate seen there `count` times: a logit <= 0 is multiplied by the
#   repeat penalty, a positive one divided by it, then `count * freq + present` is subtracted, all
#   in float32. The candidates are marked unsorted afterwards, penalised or not.
# - Logit bias adds each bias, in the order given, to the candidate at the token's own position
#   when it is still there; the others are searched for, and each candidate takes only the first
#   matching bias of those searched (llama.cpp's `to_search` loop breaks at the first match).

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

import numpy as np

from sampler_worker.candidates import Candidates
from sampler_worker.samplers import Sampler

__all__ = ["LogitBias", "Penalties"]

_F32 = np.float32


class Penalties(Sampler):
    """`llama_sampler_init_penalties(n_vocab, last_n, repeat, freq, present)`."""

    name = "penalties"

    def __init__(self, last_n: int, repeat: float = 1.0, freq: float = 0.0, present: float = 0.0) -> None:
        self.last_n = max(last_n, 0)
        self.repeat = _F32(repeat)
        self.freq = _F32(freq)
        self.present = _F32(present)
        self._recent: deque[int] = deque(maxlen=self.last_n or None)
        self._counts: Counter[int] = Counter()

    @property
    def disabled(self) -> bool:
        """True when llama.cpp would skip the sampler (nothing to remember, or nothing to apply)."""
        return self.last_n == 0 or (self.repeat == 1.0 and self.freq == 0.0 and self.present == 0.0)

    def accept(self, token: int) -> None:
        if self.last_n == 0:
            return
        if len(self._recent) == self.last_n:
            oldest = self._recent[0]
            self._counts[oldest] -= 1
            if self._counts[oldest] == 0:
                del self._counts[oldest]
        self._recent.append(token)
        self._counts[token] += 1

    def reset(self) -> None:
        self._recent.clear()
        self._counts.clear()

    def apply(self, cur: Candidates) -> None:
        if self.disabled:
            return
        if self._counts:
            tokens = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
            counts = np.fromiter(self._counts.values(), dtype=np.int64, count=len(self._counts))
            order = np.argsort(tokens)
            tokens, counts = tokens[order], counts[order]
            where = np.searchsorted(tokens, cur.ids)
            where = np.minimum(where, tokens.size - 1)
            seen = tokens[where] == cur.ids
            positions = np.flatnonzero(seen)
            count = counts[where[positions]].astype(_F32)
            logits = cur.logits[positions]
            with np.errstate(all="ignore"):
                scaled = np.where(logits <= 0, logits * self.repeat, logits / self.repeat).astype(_F32)
                cur.logits = cur.logits.copy()
                cur.logits[positions] = scaled - (count * self.freq + self.present)
        cur.is_sorted = False


class LogitBias(Sampler):
    """`llama_sampler_init_logit_bias(n_vocab, n, biases)`: add a bias to chosen tokens' logits."""

    name = "logit-bias"

    def __init__(self, biases: Sequence[tuple[int, float]]) -> None:
        self.biases = tuple((int(token), _F32(bias)) for token, bias in biases)

    def apply(self, cur: Candidates) -> None:
        if not self.biases:
            return
        size = len(cur)
        logits = cur.logits.copy()
        to_search: list[tuple[int, np.float32]] = []
        for token, bias in self.biases:
            if 0 <= token < size and cur.ids[token] == token:
                logits[token] = logits[token] + bias
            else:
                to_search.append((token, bias))
        if to_search:
            first_bias: dict[int, np.float32] = {}
            for token, bias in to_search:
                first_bias.setdefault(token, bias)
            for position in np.flatnonzero(np.isin(cur.ids, list(first_bias))).tolist():
                logits[position] = logits[position] + first_bias[int(cur.ids[position])]
        cur.logits = logits
