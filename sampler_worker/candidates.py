# The candidates a sampler chain works on: llama.cpp's `llama_token_data_array` as numpy arrays.
#
# Invariants:
# - `ids`, `logits` and `probs` have the same length, the array's `size`; position i of each is one
#   candidate (`llama_token_data{id, logit, p}`), in the order llama.cpp would hold them;
# - `logits` and `probs` are float32 and every sampler computes in float32 where llama.cpp does,
#   so the same arithmetic gives the same bits;
# - `is_sorted` is llama.cpp's `sorted` flag: True only when the candidates are known to be in
#   descending logit order (samplers rely on it exactly as llama.cpp's do, even where stale);
# - `selected` is the position (not the token id) a selecting sampler chose, or -1.

from __future__ import annotations

from functools import cache

import numpy as np
import numpy.typing as npt

__all__ = ["Candidates"]


@cache
def _token_ids(n_vocab: int) -> npt.NDArray[np.int32]:
    # Shared and read-only: candidates only ever replace their arrays, never write into them.
    ids = np.arange(n_vocab, dtype=np.int32)
    ids.flags.writeable = False
    return ids


class Candidates:
    """One step's candidate tokens, their logits and probabilities, in llama.cpp's order.

    Attributes:
        ids: token ids (int32).
        logits: logits (float32).
        probs: probabilities (float32), as the last sampler that computed them left them.
        is_sorted: llama.cpp's `sorted` flag.
        selected: position of the chosen candidate, or -1 before a selecting sampler ran.
    """

    __slots__ = ("ids", "is_sorted", "logits", "probs", "selected")

    def __init__(
        self,
        ids: npt.NDArray[np.int32],
        logits: npt.NDArray[np.float32],
        probs: npt.NDArray[np.float32] | None = None,
        *,
        is_sorted: bool = False,
    ) -> None:
        self.ids = ids
        self.logits = logits
        self.probs = np.zeros(ids.size, dtype=np.float32) if probs is None else probs
        self.is_sorted = is_sorted
        self.selected = -1

    @classmethod
    def from_logits(cls, logits: npt.ArrayLike) -> Candidates:
        """Every token of the vocabulary, id i with logit `logits[i]` (what `set_logits` builds).

        Args:
            logits: one logit per token (copied, as float32).

        Returns:
            Unsorted candidates, nothing selected.
        """
        values = np.array(logits, dtype=np.float32, copy=True).reshape(-1)
        return cls(_token_ids(values.size), values)

    def __len__(self) -> int:
        return int(self.ids.size)

    def take(self, positions: npt.NDArray[np.intp], *, is_sorted: bool | None = None) -> None:
        """Keep the candidates at `positions`, in that order (a reorder, a cut, or both)."""
        self.ids = self.ids[positions]
        self.logits = self.logits[positions]
        self.probs = self.probs[positions]
        if is_sorted is not None:
            self.is_sorted = is_sorted

    def truncate(self, size: int) -> None:
        """Keep the first `size` candidates (llama.cpp's `cur_p->size = size`)."""
        self.ids = self.ids[:size]
        self.logits = self.logits[:size]
        self.probs = self.probs[:size]

    @property
    def token(self) -> int:
        """The id of the selected candidate.

        Raises:
            ValueError: no candidate is selected.
        """
        if not 0 <= self.selected < self.ids.size:
            raise ValueError("no candidate is selected")
        return int(self.ids[self.selected])
