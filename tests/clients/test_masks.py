"""Client-side masks (clients/masks.py): from the wire, counted, applied to logits."""

from __future__ import annotations

import numpy as np

from clients.masks import apply_mask, count_allowed, mask_allows, mask_from_wire, unpack_mask
from constraintd.engine.masks.bitmask import pack_mask
from constraintd.v1 import constraintd_pb2 as pb

ALLOWED = np.zeros(70, dtype=bool)
ALLOWED[[0, 5, 31, 32, 63, 69]] = True


def test_a_wire_mask_becomes_the_engines_words() -> None:
    words = pack_mask(ALLOWED)
    wire = pb.Mask(words=words.astype("<i4").tobytes(), vocab_size=70, allowed=6)
    decoded = mask_from_wire(wire)
    assert decoded.dtype == np.int32 and decoded.flags.writeable
    assert np.array_equal(decoded, words)
    assert np.array_equal(unpack_mask(decoded, 70), ALLOWED)
    assert count_allowed(decoded) == 6


def test_a_mask_allowing_everything_comes_as_a_flag_and_becomes_every_word() -> None:
    decoded = mask_from_wire(pb.Mask(vocab_size=70, allowed=70, all_allowed=True))
    assert decoded.dtype == np.int32 and decoded.flags.writeable
    assert np.array_equal(unpack_mask(decoded, 70), np.ones(70, dtype=bool))
    assert count_allowed(decoded) == 70  # the padding past token 69 stays 0


def test_mask_allows_reads_one_tokens_bit() -> None:
    words = pack_mask(ALLOWED)
    assert [mask_allows(words, token) for token in range(70)] == ALLOWED.tolist()


def test_apply_mask_forbids_what_the_mask_forbids_and_the_padding() -> None:
    logits = np.arange(100, dtype=np.float32)  # a model's output padded past the 70-token vocabulary
    result = apply_mask(logits, pack_mask(ALLOWED))
    assert result is logits
    assert np.array_equal(np.isfinite(logits[:70]), ALLOWED)
    assert np.all(np.isneginf(logits[70:]))
    assert logits[5] == 5.0 and logits[69] == 69.0


def test_apply_mask_works_on_a_batch_of_rows() -> None:
    logits = np.zeros((2, 70))
    apply_mask(logits, pack_mask(ALLOWED))
    assert np.array_equal(np.isfinite(logits), np.stack([ALLOWED, ALLOWED]))
