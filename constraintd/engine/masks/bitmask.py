# The packed token mask: the layout of XGrammar, llguidance and vLLM, and the bytes on the wire.
#
# Invariants:
# - ceil(n_tokens / 32) int32 words; token j is bit j % 32 of word j // 32; 1 = allowed; bits past
#   n_tokens are 0. Word values are those of the little-endian 32-bit words (sent as `<i4`).
# - Nothing here knows grammars: these are conversions between bools, words and logits.
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from constraintd.errors import InputError

__all__ = [
    "allocate_masks",
    "allow_tokens",
    "allowed_tokens",
    "apply_mask",
    "few_allowed_tokens",
    "mask_allows",
    "mask_words",
    "pack_mask",
    "unpack_mask",
]


def mask_words(n_tokens: int) -> int:
    """How many 32-bit words a mask over `n_tokens` tokens has."""
    return (n_tokens + 31) // 32


def pack_mask(allowed: npt.ArrayLike) -> npt.NDArray[np.int32]:
    """Pack one bool per token into mask words."""
    bits = np.asarray(allowed, dtype=np.bool_).reshape(-1)
    padded = np.zeros(mask_words(bits.size) * 32, dtype=np.bool_)
    padded[: bits.size] = bits
    return np.packbits(padded, bitorder="little").view("<u4").astype(np.int32)


def allocate_masks(batch: int, n_tokens: int) -> npt.NDArray[np.int32]:
    """A writable `(batch, mask_words(n_tokens))` buffer of masks, every row allowing all `n_tokens` tokens
    (XGrammar's `allocate_token_bitmask`); `Matcher.fill_mask(buffer, row)` writes one row.

    Raises:
        InputError: `batch` is negative or `n_tokens` is not positive.
    """
    if batch < 0 or n_tokens <= 0:
        raise InputError(f"cannot allocate {batch} masks over {n_tokens} tokens")
    row = pack_mask(np.ones(n_tokens, dtype=np.bool_))
    return np.tile(row, (batch, 1))


def allow_tokens(words: npt.NDArray[np.int32], ids: npt.NDArray[np.int64]) -> None:
    """Set the bits of the tokens `ids` in `words`, in place: bit by bit for a few, through a row of
    bools for many (the cheaper way each)."""
    if ids.size * 8 < words.size * 32:
        np.bitwise_or.at(words.view(np.uint32), ids >> 5, np.left_shift(1, ids & 31).astype(np.uint32))
    else:
        bits = np.zeros(words.size * 32, dtype=np.bool_)
        bits[ids] = True
        words |= pack_mask(bits)


def unpack_mask(words: npt.ArrayLike, n_tokens: int) -> npt.NDArray[np.bool_]:
    """One bool per token from mask words.

    Raises:
        InputError: the words are fewer than `n_tokens` needs.
    """
    packed = np.asarray(words, dtype=np.int32).reshape(-1)
    if packed.size < mask_words(n_tokens):
        raise InputError(f"{packed.size} mask words cannot hold {n_tokens} tokens")
    bits = np.unpackbits(packed.astype("<i4").view(np.uint8), bitorder="little")
    return bits[:n_tokens].astype(np.bool_)


_FEW_WORDS = 8  # `few_allowed_tokens`: at most this many pairs of words holding a bit are read in Python


def _checked(words: npt.ArrayLike, n_tokens: int) -> tuple[npt.NDArray[np.int32], int]:
    packed = np.asarray(words, dtype=np.int32).reshape(-1)
    needed = mask_words(n_tokens)
    if packed.size < needed:
        raise InputError(f"{packed.size} mask words cannot hold {n_tokens} tokens")
    return packed, needed


def few_allowed_tokens(words: npt.ArrayLike, n_tokens: int) -> npt.NDArray[np.int64] | None:
    """The ids of the allowed tokens, ascending, where they are few: at most _FEW_WORDS pairs of words
    hold them (a redraw's mask, most often); None otherwise. Only those words are read, their bits in
    Python: a few of the vocabulary's thousands, found two words at a time.

    Raises:
        InputError: the words are fewer than `n_tokens` needs.
    """
    return _few(*_checked(words, n_tokens), n_tokens)


def _few(packed: npt.NDArray[np.int32], needed: int, n_tokens: int) -> npt.NDArray[np.int64] | None:
    if not packed.flags.c_contiguous:
        return None
    pairs = needed // 2  # the words two at a time: half the elements for numpy's scan
    # numpy's nonzero of a bool array is its fast one: of the words themselves it costs three times as much
    held_pairs = (packed[: 2 * pairs].view(np.uint64) != 0).nonzero()[0]
    if held_pairs.size > _FEW_WORDS:
        return None
    held = [2 * pair + half for pair in held_pairs.tolist() for half in (0, 1)]
    if needed % 2:
        held.append(needed - 1)
    found: list[int] = []
    for word in held:
        word_bits = int(packed[word]) & 0xFFFF_FFFF
        while word_bits:
            low = word_bits & -word_bits
            found.append(32 * word + low.bit_length() - 1)
            word_bits ^= low
    return np.array([i for i in found if i < n_tokens], dtype=np.int64)


def allowed_tokens(words: npt.ArrayLike, n_tokens: int) -> npt.NDArray[np.int64]:
    """The ids of the allowed tokens, ascending: `few_allowed_tokens` where they are few; otherwise the
    words that hold any, their bits unpacked by numpy (every bit at once when they are many).

    Raises:
        InputError: the words are fewer than `n_tokens` needs.
    """
    packed, needed = _checked(words, n_tokens)
    few = _few(packed, needed, n_tokens)
    if few is not None:
        return few
    held = (packed[:needed] != 0).nonzero()[0]
    if held.size * 8 > needed:  # many: every bit at once
        return np.flatnonzero(unpack_mask(packed, n_tokens))
    bits = np.unpackbits(packed[held].astype("<i4").view(np.uint8), bitorder="little").view(np.bool_)
    at = np.flatnonzero(bits)
    ids: npt.NDArray[np.int64] = held[at >> 5] * 32 + (at & 31)  # word by word: ascending
    return ids[ids < n_tokens]


def apply_mask(logits: npt.NDArray[np.floating], words: npt.ArrayLike) -> npt.NDArray[np.floating]:
    """Set, in place, the logit of every token the mask forbids to -inf (as llama.cpp's grammar sampler
    does), and return the logits.

    `logits` holds one value per token in its last axis (a batch of rows takes the same mask) and may be
    longer than the vocabulary (a model's padded output): tokens past the mask's words are forbidden too.
    Does not touch the logits of allowed tokens.
    """
    packed = np.asarray(words, dtype=np.int32).reshape(-1)
    allowed = unpack_mask(packed, min(logits.shape[-1], 32 * packed.size))
    logits[..., : allowed.size][..., ~allowed] = -np.inf
    logits[..., allowed.size :] = -np.inf
    return logits


def mask_allows(words: npt.NDArray[np.int32], token: int) -> bool:
    """Whether the mask allows `token` (bit token % 32 of word token // 32), without unpacking it."""
    return bool(int(words[token >> 5]) >> (token & 31) & 1)
