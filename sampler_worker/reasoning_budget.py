# llama.cpp's reasoning-budget sampler (common/reasoning-budget.cpp), and how llama-server sets it up for a
# chat (tools/server: the chat params' thinking tags, the request's budget and message).
#
# A thinking template writes its reasoning between a start tag and an end tag (`<think>` ... `</think>`).
# The sampler watches the generated tokens for the start tag's token sequence, then counts the tokens of
# the block; when the budget is spent it forces the budget message and the first end tag, token by token,
# after the last token's UTF-8 character is complete. A natural end tag ends the block early; a new start
# tag opens a new block with a fresh budget. llama-server also runs it with no limit beside a lazy tool
# grammar, to keep the thinking block from that grammar: the grammar sees no token of the block (a trigger
# word written while thinking starts nothing) and is fed the end tag's tokens when the block ends, as the
# trigger may sit right after it.
#
# States (llama.cpp's `common_reasoning_budget_state`, in its order):
#   IDLE: watching for a start sequence;
#   COUNTING: in the block, counting down, watching for an end sequence;
#   FORCING: forcing `forced` token by token (every other token's logit is -inf);
#   WAITING_UTF8: the budget is spent, tokens go on until the text's last character is complete;
#   DONE: the block has ended: watching for a new start sequence.
#
# Invariant: `state`, `forced_token()` and `end_match()` after any tokens are those of llama.cpp's sampler
# after the same tokens (the oracle test runs both on the same token streams).
from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence

from constraintd.engine.aho_corasick import AhoCorasick

__all__ = ["UNLIMITED", "BudgetState", "ReasoningBudget", "server_budget", "utf8_complete"]

# llama-server's budget when the request sets none (-1): no limit, the sampler made only for a lazy grammar
UNLIMITED = 2**31 - 1


class BudgetState(enum.IntEnum):
    IDLE = 0
    COUNTING = 1
    FORCING = 2
    WAITING_UTF8 = 3
    DONE = 4


def utf8_complete(piece: bytes) -> bool:
    """common_utf8_is_complete: whether the bytes end on a whole UTF-8 character (an empty piece does)."""
    if not piece:
        return True
    for back in range(1, min(4, len(piece)) + 1):
        byte = piece[-back]
        if byte & 0xC0 != 0x80:
            expected = 4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0 else 1
            return back >= expected
    return False


class _Matcher:
    """token_matcher: the longest of `sequences` that ends at the last token, by an Aho-Corasick automaton
    over token ids; the search starts over after a match."""

    __slots__ = ("_automaton", "_state", "sequences")

    def __init__(self, sequences: Iterable[Sequence[int]]) -> None:
        kept: list[tuple[int, ...]] = []
        for sequence in map(tuple, sequences):
            if sequence and sequence not in kept:
                kept.append(sequence)
        self.sequences: tuple[tuple[int, ...], ...] = tuple(kept)
        self._automaton = AhoCorasick(self.sequences)
        self._state = 0

    def advance(self, token: int) -> int:
        """The index in `sequences` of the longest one ending at `token`, or -1."""
        self._state = self._automaton.next(self._state, token)
        found = self._automaton.match[self._state]
        if found >= 0:
            self._state = 0
        return found

    def reset(self) -> None:
        self._state = 0


class ReasoningBudget:
    """common_reasoning_budget: the sampler's state after the tokens it accepted.

    Args:
        start: token sequences, any of which opens a block.
        end: token sequences, any of which ends one.
        forced: the sequence forced when the budget is spent (llama-server: the message, then the first end
            tag).
        budget: the most tokens a block may have (0: the end is forced at once).
        complete: whether a token's text ends on a whole character (`utf8_complete` of its piece without
            special tokens' text); None counts every token complete (llama.cpp without a vocabulary).
        initial: the state before any token (COUNTING with no budget starts FORCING).
    """

    __slots__ = ("_complete", "_end", "_end_match", "_start", "budget", "force_pos", "forced", "remaining",
                 "state")

    def __init__(
        self,
        start: Sequence[Sequence[int]],
        end: Sequence[Sequence[int]],
        forced: Sequence[int],
        budget: int,
        *,
        complete: Callable[[int], bool] | None = None,
        initial: BudgetState = BudgetState.IDLE,
    ) -> None:
        if initial == BudgetState.COUNTING and budget <= 0:
            initial = BudgetState.FORCING
        self._start = _Matcher(start)
        self._end = _Matcher(end)
        self.forced: tuple[int, ...] = tuple(forced)
        self.budget = budget
        self.remaining = budget
        self.state = initial
        self.force_pos = 0
        self._end_match = -1
        self._complete = complete

    def accept(self, token: int) -> None:
        """Take one generated token (llama.cpp's `common_reasoning_budget_accept`)."""
        state = self.state
        if state == BudgetState.IDLE:
            if self._start.advance(token) >= 0:
                self._open()
        elif state in (BudgetState.COUNTING, BudgetState.WAITING_UTF8):
            match = self._end.advance(token)
            if match >= 0:
                self.state = BudgetState.DONE
                self._end_match = match
                return
            complete = self._complete is None or self._complete(token)
            if state == BudgetState.WAITING_UTF8:
                if complete:
                    self._force()
            else:
                self.remaining -= 1
                if self.remaining <= 0:
                    if complete:
                        self._force()
                    else:
                        self.state = BudgetState.WAITING_UTF8
                        self._end.reset()
        elif state == BudgetState.FORCING:
            # the end sequence is followed inside the forced tokens too, so that DONE reports it
            match = self._end.advance(token)
            self.force_pos += 1
            if self.force_pos >= len(self.forced):
                self.state = BudgetState.DONE
                self._end_match = match
        elif self._start.advance(token) >= 0:  # DONE: a new block gets a fresh budget
            self._open()
            self._end.reset()
            self._end_match = -1

    def forced_token(self) -> int | None:
        """The token the sampler forces now (`apply` leaves every other token -inf), or None."""
        if self.state != BudgetState.FORCING or self.force_pos >= len(self.forced):
            return None
        return self.forced[self.force_pos]

    def end_match(self) -> tuple[int, ...] | None:
        """The end sequence that ended the last block (None: none did, or a new block opened since)."""
        return self._end.sequences[self._end_match] if self._end_match >= 0 else None

    def force(self) -> bool:
        """End a block that is counting now: force the end sequence from the next token. Whether it did."""
        if self.state != BudgetState.COUNTING:
            return False
        self._force()
        return True

    def _open(self) -> None:
        self.state = BudgetState.COUNTING
        self.remaining = self.budget
        if self.remaining <= 0:
            self.state = BudgetState.FORCING
            self.force_pos = 0

    def _force(self) -> None:
        self.state = BudgetState.FORCING
        self.force_pos = 0
        self._end.reset()


def server_budget(
    *,
    start_tag: str,
    end_tags: Sequence[str],
    tokens: int,
    message: str,
    lazy: bool,
    tokenize: Callable[[str], list[int]],
    complete: Callable[[int], bool] | None,
    prefill: Sequence[int] = (),
    control: bool = False,
) -> ReasoningBudget | None:
    """The budget llama-server runs for a chat whose template has thinking tags, or None where it runs none.

    As llama-server: the tags and the message are tokenized as text with special tokens parsed and no BOS
    (`tokenize`); the forced sequence is the message's tokens, then the first end tag's; the sampler is made
    when the start and end tags give tokens, and the grammar is lazy, or `tokens` is not -1 (no limit), or
    `control` asks for it (the request's `reasoning_control`: its block may be ended while it runs, with
    `force`); it then accepts the generation prompt's tokens (`prefill`), so that a prompt ending in the
    start tag opens the block.

    Args:
        start_tag, end_tags: the chat params' thinking tags (none without thinking).
        tokens: the budget, -1 for none (`--reasoning-budget`).
        message: written before the end tag when the budget forces it (`--reasoning-budget-message`).
        lazy: whether the session's grammar is lazy (the block is then kept from it).
        complete: see ReasoningBudget.
        prefill: the generation prompt's tokens, as common_sampler_init computes them.
    """
    if not end_tags:
        return None
    start = tokenize(start_tag) if start_tag else []
    end = [tokenize(tag) for tag in end_tags if tag]
    if not start or not end or not (lazy or tokens >= 0 or control):
        return None
    forced = [*(tokenize(message) if message else []), *end[0]]
    budget = ReasoningBudget([start], end, forced, UNLIMITED if tokens < 0 else tokens, complete=complete)
    for token in prefill:
        budget.accept(token)
    return budget
