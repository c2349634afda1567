# Masks of one grammar, cached two ways so that most masks cost a few array ORs.
#
# Contract:
# - `MaskCache.mask(state, partial, limit)` is exactly `mask.compute_mask(state, partial, ...)`: the packed
#   mask of the tokens llama.cpp's apply allows (read-only).
# - Finished masks are kept by (state, partial); states are interned, so a state seen before costs a dict
#   lookup.
# - Per stack top (the top `CONTEXT_DEPTH` positions of a stack), the verdicts that do not depend on what
#   lies below are kept too (the idea of XGrammar's adaptive token mask cache): walking every token from
#   that top with an escape mark below (stacks.Rules.escape) splits the vocabulary into tokens allowed
#   whatever is below, tokens rejected whatever is below, and the "uncertain" few that reach below. A
#   token is allowed from a stack set when some stack allows it (llama_grammar_reject_candidates), so
#   the mask of a new state is the OR of its stack tops' allowed tokens, its token-topped stacks' tokens,
#   the end-of-generation tokens if it may end, and the uncertain tokens that a walk from the whole
#   state, over those tokens only, allows. Tops are shared by every state whose stacks end alike: the
#   same JSON string rule at any nesting depth, say. One top position alone would leave most tokens
#   uncertain (a repeated character class is the last element of its own rule). A state with many
#   tops not seen before is walked whole instead, without learning them.
# - After an unfinished UTF-8 sequence (rare: a token cut a character) the mask is walked whole.
# - Both caches drop their least recently used entries beyond a size; the answers never depend on them.
from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Final, TypeVar

import numpy as np
import numpy.typing as npt

from constraintd.engine.bitmask import mask_words, pack_mask
from constraintd.engine.decoded_vocab import END_OF_GENERATION, DecodedVocab
from constraintd.engine.mask import compute_mask, walk
from constraintd.engine.stacks import TOKEN, Stack
from constraintd.engine.states import State, StateTable
from constraintd.engine.utf8 import FRESH, PartialUtf8

__all__ = ["CONTEXT_DEPTH", "MAX_NEW_TOPS", "MaskCache"]

# Positions a stack top keeps (the stack's own positions when it is no deeper).
CONTEXT_DEPTH: Final = 4
# Tops not seen before that one mask may learn; above, the state is walked whole.
MAX_NEW_TOPS: Final = 16

Words = npt.NDArray[np.int32]
IntArray = npt.NDArray[np.int64]
K = TypeVar("K")
V = TypeVar("V")


class MaskCache:
    """The masks of one grammar on its vocabulary (see the module comment)."""

    __slots__ = ("_masks", "_tops", "max_masks", "max_tops", "states", "vocab")

    def __init__(
        self,
        states: StateTable,
        vocab: DecodedVocab,
        *,
        max_masks: int = 512,
        max_tops: int = 2048,
    ) -> None:
        self.states = states
        self.vocab = vocab
        self.max_masks = max_masks
        self.max_tops = max_tops
        self._masks: OrderedDict[tuple[State, PartialUtf8], Words] = OrderedDict()
        # stack top -> (the tokens allowed whatever is below: a mask, or their ids when they are few;
        # the uncertain table rows)
        self._tops: OrderedDict[Stack, tuple[Words | IntArray, IntArray]] = OrderedDict()

    def mask(self, state: State, partial: PartialUtf8, limit: int) -> Words:
        """The packed mask of the tokens llama.cpp allows from `state` after `partial` (read-only).

        Raises:
            LimitError: a state met inside a token has more than `limit` stacks.
        """
        key = (state, partial)
        mask = _lookup(self._masks, key)
        if mask is None:
            if partial[1] > 0:
                mask = compute_mask(state, partial, self.vocab, limit)
            else:
                mask = self._compose(state, limit)
                mask.flags.writeable = False
            _store(self._masks, key, mask, self.max_masks)
        return mask

    def _compose(self, state: State, limit: int) -> Words:
        escape = self.states.rules.escape
        tops = {
            stack if len(stack) <= CONTEXT_DEPTH else (escape, *stack[-CONTEXT_DEPTH:])
            for stacks in state.by_top.values()
            for stack in stacks
        }
        if sum(top not in self._tops for top in tops) > MAX_NEW_TOPS:
            return compute_mask(state, FRESH, self.vocab, limit)
        vocab = self.vocab
        table = vocab.fresh_table()
        words = np.zeros(mask_words(vocab.n_tokens), dtype=np.int32)
        extra = np.zeros(vocab.n_tokens, dtype=np.bool_)
        uncertain: list[IntArray] = []
        for top in tops:
            allowed, unsure = self._top(top, limit)
            if allowed.dtype == np.int32:
                words |= allowed
            else:
                extra[allowed] = True
            uncertain.append(unsure)
        if state.has_empty:
            extra[vocab.kinds == END_OF_GENERATION] = True
        # token-topped stacks take any token with a code point, by id alone
        with_code_points = table.ids[: table.count_from[0] if table.count_from else 0]
        for kind, value, _ in state.token_tops:
            if kind == TOKEN:
                extra[with_code_points[with_code_points == value]] = True
            else:
                extra[with_code_points[with_code_points != value]] = True
        rows = np.unique(np.concatenate(uncertain)) if uncertain else np.zeros(0, dtype=np.int64)
        if rows.size:
            ids = table.ids[rows]
            undecided = ((words[ids >> 5] >> (ids & 31)) & 1) == 0
            rows = rows[undecided & ~extra[ids]]
        if rows.size:
            found, _ = walk(table, table.columns, state, limit, rows=rows)
            extra[table.ids[found]] = True
        return words | pack_mask(extra)

    def __len__(self) -> int:
        return len(self._masks)

    @property
    def nbytes(self) -> int:
        """Bytes of the finished masks kept (their arrays only, not the dict around them)."""
        return sum(mask.nbytes for mask in self._masks.values())

    def forget_masks(self) -> None:
        """Drops the finished masks (not the per-top verdicts): the next masks are composed anew."""
        self._masks.clear()

    @property
    def tops(self) -> int:
        """How many stack tops' verdicts are kept."""
        return len(self._tops)

    def _top(self, top: Stack, limit: int) -> tuple[Words | IntArray, IntArray]:
        found = _lookup(self._tops, top)
        if found is not None:
            return found
        start = self.states.intern([top], limit)
        assert start is not None
        table = self.vocab.fresh_table()
        allowed_rows, uncertain_rows = walk(table, table.columns, start, limit)
        ids = np.sort(table.ids[allowed_rows])
        allowed: Words | IntArray = ids
        if ids.size * 64 >= self.vocab.n_tokens:  # a mask takes less room than the ids
            bits = np.zeros(self.vocab.n_tokens, dtype=np.bool_)
            bits[ids] = True
            allowed = pack_mask(bits)
        verdicts = (allowed, uncertain_rows)
        _store(self._tops, top, verdicts, self.max_tops)
        return verdicts


def _lookup(cache: OrderedDict[K, V], key: K) -> V | None:
    found = cache.get(key)
    if found is not None:
        with contextlib.suppress(KeyError):  # dropped meanwhile by another thread
            cache.move_to_end(key)
    return found


def _store(cache: OrderedDict[K, V], key: K, value: V, size: int) -> None:
    cache[key] = value
    while len(cache) > size:
        try:
            cache.popitem(last=False)
        except KeyError:
            break
