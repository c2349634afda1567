# Packed token masks on the client side: from the wire, to booleans, onto logits.
#
# The layout (XGrammar's, llguidance's, vLLM's): 32-bit words; token j is bit j % 32 of word j // 32;
# 1 = allowed; ceil(vocab_size / 32) words; bits past vocab_size are 0. On the wire the words are
# little-endian; in memory a mask is a numpy int32 array in the machine's order, as the engine makes it,
# so it drops into `apply_token_bitmask` kernels unchanged. Unpacking, applying and testing a mask are the
# engine's (constraintd/engine/masks/bitmask.py), re-exported here: one definition of each.
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from constraintd.engine.masks.bitmask import (
    allocate_masks,
    allowed_tokens,
    apply_mask,
    mask_allows,
    unpack_mask,
)
from constraintd.v1 import constraintd_pb2 as pb

__all__ = ["allowed_tokens", "apply_mask", "count_allowed", "mask_allows", "mask_from_wire", "unpack_mask"]


def mask_from_wire(mask: pb.Mask) -> npt.NDArray[np.int32]:
    """The packed words of a wire mask, as a writable int32 array (all its words for `all_allowed`)."""
    if mask.all_allowed:
        return allocate_masks(1, mask.vocab_size).reshape(-1)
    return np.frombuffer(mask.words, dtype="<i4").astype(np.int32)


def count_allowed(words: npt.NDArray[np.int32]) -> int:
    """How many tokens the mask allows."""
    return int(np.unpackbits(np.asarray(words, dtype="<i4").view(np.uint8)).sum())

