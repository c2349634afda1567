"""The wire form of masks (constraintd/service/operations.py): `encode_mask` and the kept encodings."""

from __future__ import annotations

import numpy as np

from constraintd.engine.masks.bitmask import allocate_masks, pack_mask
from constraintd.service.operations import WireMasks, encode_mask

ALLOWED = np.zeros(70, dtype=bool)
ALLOWED[[0, 5, 31, 32, 63, 69]] = True


def read_only(words: np.ndarray) -> np.ndarray:
    words.flags.writeable = False
    return words


def test_encode_mask_counts_and_packs_little_endian_words() -> None:
    words = pack_mask(ALLOWED)
    mask = encode_mask(words, 70)
    assert mask.allowed == 6 and mask.vocab_size == 70 and not mask.all_allowed
    assert mask.words == words.astype("<i4").tobytes()


def test_compact_sends_a_mask_allowing_everything_as_a_flag_only() -> None:
    full = allocate_masks(1, 70).reshape(-1)
    assert encode_mask(full, 70, compact=True).all_allowed
    assert encode_mask(full, 70, compact=True).words == b""
    assert encode_mask(full, 70).words == full.astype("<i4").tobytes()  # not compact: every word
    assert not encode_mask(pack_mask(ALLOWED), 70, compact=True).all_allowed


def test_kept_encodings_answer_what_encode_mask_answers() -> None:
    wire = WireMasks(size=2)
    first, second, third = (read_only(pack_mask(np.roll(ALLOWED, shift))) for shift in (0, 1, 2))
    full = read_only(allocate_masks(1, 70).reshape(-1))
    for words in (first, second, first, third, first, full, full):
        for compact in (False, True):
            assert wire.encode(words, 70, compact=compact) == encode_mask(words, 70, compact=compact)
    # a writeable array may change after it is answered: it is encoded anew each time
    changing = pack_mask(ALLOWED)
    assert wire.encode(changing, 70, compact=False).allowed == 6
    changing[0] = 0
    assert wire.encode(changing, 70, compact=False).allowed == 3
