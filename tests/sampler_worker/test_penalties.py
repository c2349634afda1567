"""sampler_worker.penalties: the ring buffer of recent tokens and the logit arithmetic.

(Token-for-token agreement with llama.cpp's penalties and logit bias is in test_chain.py.)
"""

from __future__ import annotations

import numpy as np

from sampler_worker.candidates import Candidates
from sampler_worker.penalties import LogitBias, Penalties


def test_only_the_last_n_tokens_count() -> None:
    penalties = Penalties(3, repeat=2.0)
    for token in [5, 5, 6, 7, 8]:
        penalties.accept(token)
    cur = Candidates.from_logits(np.full(10, 4.0, dtype=np.float32))
    penalties.apply(cur)
    assert cur.logits.tolist() == [4.0] * 6 + [2.0, 2.0, 2.0, 4.0]
    assert not cur.is_sorted


def test_negative_logits_are_multiplied_and_counts_subtracted() -> None:
    penalties = Penalties(8, repeat=1.5, freq=0.25, present=1.0)
    for token in [1, 1, 2]:
        penalties.accept(token)
    cur = Candidates.from_logits(np.array([1.0, -2.0, 3.0], dtype=np.float32))
    penalties.apply(cur)
    assert cur.logits.tolist() == [1.0, -3.0 - (2 * 0.25 + 1.0), 2.0 - (0.25 + 1.0)]


def test_reset_forgets() -> None:
    penalties = Penalties(4, repeat=2.0)
    penalties.accept(0)
    penalties.reset()
    cur = Candidates.from_logits(np.ones(2, dtype=np.float32))
    penalties.apply(cur)
    assert cur.logits.tolist() == [1.0, 1.0]


def test_disabled_when_nothing_would_change() -> None:
    assert Penalties(64).disabled
    assert Penalties(0, repeat=1.3).disabled
    assert not Penalties(64, present=0.1).disabled


def test_logit_bias_searches_moved_tokens_and_takes_the_first_bias() -> None:
    cur = Candidates(np.array([4, 2, 9], dtype=np.int32), np.zeros(3, dtype=np.float32))
    LogitBias([(9, 1.0), (9, 5.0), (2, -1.0), (1, 7.0)]).apply(cur)
    # no token sits at its own index, so every bias is searched for: token 9 takes only the first
    # of its two biases, token 1 is not among the candidates
    assert cur.logits.tolist() == [0.0, -1.0, 1.0]
