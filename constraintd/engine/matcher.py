# The cursor over a compiled grammar: one generation's state, cheap to fork, roll back and replay.
#
# Contract (DESIGN.md, fixed points):
# - State is the stack set (an interned `State`), the unfinished UTF-8 sequence, the lazy trigger wait
#   (its buffer) and the trail that `rollback` pops. Everything else is the `Grammar`'s.
# - The trail is three parallel columns, one entry per step: the state before it (a reference), its
#   context (partial sequence, trigger wait, tokens buffered; one tuple object shared by consecutive
#   steps while it does not change) and the token (an int32 array; -1 for `accept_bytes`). About 20 bytes
#   a step, so an idle session of a few hundred tokens stays a few kilobytes.
# - With a rollback window (`max_rollback` W, XGrammar's max_rollback_tokens) the matcher remembers its
#   last W steps, as XGrammar's bounded history: a step pushes one in (the oldest out, past W), a rollback
#   of n takes n out. `_floor` is the path's length below which no rollback reaches. The trail may hold a
#   little more than the window (slack): past W + max(W / 4, ROLLBACK_SLACK) steps, its steps below the
#   floor are dropped at once (amortized: a few entries moved a step, not a shift of W each step). What the
#   window allows is exact whatever the slack holds: `rollback(n)` past it raises InputError, `history`
#   lists the tokens inside it. The steps and tokens dropped are counted, so `position` is still every
#   token accepted. A waiting lazy grammar's buffer and buffered
#   tokens stay whole (a trigger pattern's match may start anywhere in them), as two columns: a token
#   waiting costs its piece's bytes and 12 bytes more. Where the trigger patterns' search stands is kept
#   after every SCAN_EVERY-th buffered token only, and the latest: a rollback takes the search from the
#   last kept one over the buffer cut back (a search's state is a function of the bytes it read, and none
#   of those read while waiting matched). A scan kept after every token cost 350 bytes to a kilobyte
#   and objects the garbage collector walks (a million tokens waited through took tens of full
#   collections); those older than the oldest step kept go too (only a rollback reads them).
# - `allows(t)` is True exactly when llama_grammar_apply_impl leaves t finite; `mask()` packs `allows`
#   over the vocabulary; neither changes anything. Where the answer is known already, `allows` reads it
#   instead of walking the token: the bit of the last mask this matcher made (held until the next step),
#   the token's move memoized on the state, or the bit of a mask the grammar's cache holds for the state.
# - `fill_mask(out, index)` is the field's batch API (XGrammar's and llguidance's fill_next_token_bitmask):
#   `mask()` written into one row of a `(batch, words)` buffer (masks/bitmask.py's `allocate_masks`),
#   answering whether the row needs applying at all.
# - The single-token path touches as little as it can: a token accepted from a state at a fresh UTF-8
#   start is memoized on that state (`State.moves`, shared by every matcher of the grammar; MAX_MOVES
#   tokens a state at most), so a path some session took before costs one dict lookup a token.
# - `accept(t)` is llama_grammar_accept_impl on a token `allows` allows: it returns False, and changes
#   nothing, for a token `allows` refuses (llama.cpp would accept some of those blindly: an invalid UTF-8
#   piece, a piece whose unfinished end cannot match; the sampler never gives it one) and for one whose
#   acceptance leaves no stack (llama.cpp throws and the server aborts: a token terminal after characters
#   inside one token, or a lazy grammar's replay the grammar refuses).
# - An end-of-generation token is accepted when the grammar is complete and changes no stacks, as in
#   llama.cpp. A lazy grammar allows and accepts every token while it waits.
# - A stack set above `max_stacks` raises LimitError and leaves the matcher as it was.
from __future__ import annotations

import operator
import sys
import time
from array import array
from bisect import bisect_right
from typing import Final

import numpy as np
import numpy.typing as npt

from constraintd.engine.grammar.compiled import Grammar
from constraintd.engine.grammar.stack_sets import DEAD, Move, State
from constraintd.engine.grammar.stacks import StackSet
from constraintd.engine.grammar.triggers import BufferedToken, TriggerScan
from constraintd.engine.grammar.utf8 import FRESH, INVALID, PartialUtf8, decode_utf8
from constraintd.engine.vocab.decoded import END_OF_GENERATION, NEVER
from constraintd.errors import DeadlineError, InputError, LimitError, TokenError

__all__ = ["Matcher"]

_BYTES: Final = -1  # trail entry of an accept_bytes call
MAX_MOVES: Final = 4096  # tokens whose moves one state remembers (a few hundred kilobytes at most)
ACCEPT_BYTES_CHECK: Final = 64  # code points of a text taken between two readings of its deadline's clock
# steps a windowed trail may hold past its window, at least, before it is trimmed back to the window
ROLLBACK_SLACK: Final = 256
# a waiting lazy grammar keeps its trigger patterns' search after every this many buffered tokens
SCAN_EVERY: Final = 64
_NO_WORDS: Final = np.zeros(0, dtype=np.int32).data
_index: Final = operator.index
# (partial, awaiting trigger, tokens buffered) before one step
_Context = tuple[PartialUtf8, bool, int]


class Matcher:
    """The state of one generation over a `Grammar`: allows / accept / mask, fork and rollback."""

    __slots__ = (
        "_awaiting",
        "_buffer",
        "_buffered_ends",
        "_buffered_tokens",
        "_dropped",
        "_dropped_tokens",
        "_floor",
        "_mask_state",
        "_mask_words",
        "_n_vocab",
        "_partial",
        "_scan",
        "_scan_base",
        "_scans",
        "_state",
        "_trail_contexts",
        "_trail_states",
        "_trail_tokens",
        "_trim_at",
        "grammar",
        "max_rollback",
        "max_stacks",
    )

    def __init__(
        self, grammar: Grammar, *, max_stacks: int = 10_000, max_rollback: int | None = None
    ) -> None:
        """Start at the beginning of `grammar`.

        Args:
            grammar: the compiled grammar.
            max_stacks: the most stacks the matcher may hold at once.
            max_rollback: the rollback window: how many of its last steps the matcher remembers, so the
                most `rollback` undoes (0: none); None remembers every step.

        Raises:
            LimitError: the grammar starts with more than `max_stacks` stacks.
            ValueError: `max_rollback` is negative.
        """
        if max_rollback is not None and max_rollback < 0:
            raise ValueError(f"a rollback window of {max_rollback} steps")
        self.grammar = grammar
        self.max_stacks = max_stacks
        self.max_rollback = max_rollback
        # the trail's length past which it is trimmed back to the window
        self._trim_at = (
            sys.maxsize if max_rollback is None else max_rollback + max(max_rollback >> 2, ROLLBACK_SLACK)
        )
        self._n_vocab = grammar.n_vocab
        self._trail_states: list[State] = []
        self._trail_contexts: list[_Context] = []
        self._trail_tokens = array("i")
        self._buffer = bytearray()
        # the tokens buffered while a lazy grammar waits, and where each one's piece ends in the buffer
        # (it begins where the one before ends): Triggers' (token, begin, end), as columns
        self._buffered_tokens = array("i")
        self._buffered_ends = array("q")
        # where the trigger patterns' search stands: after every buffered token (`_scan`), and kept after
        # every SCAN_EVERY-th: _scans[i] is the scan after _scan_base + i * SCAN_EVERY buffered tokens
        # (those before are dropped with the steps that could roll back to them)
        self._scan: TriggerScan = grammar._triggers.start()
        self._scans: list[TriggerScan] = [self._scan]
        self._start()

    def _start(self) -> None:
        initial = self.grammar._initial
        assert initial is not None  # every alternate of the root advances to at least one stack
        if len(initial.stacks) > self.max_stacks:
            raise LimitError(f"the grammar starts with {len(initial.stacks)} stacks, above {self.max_stacks}")
        self._state: State = initial
        self._partial: PartialUtf8 = FRESH
        self._scan_base = 0
        # steps dropped from the trail's front by the window, and the tokens among them; the path's length
        # below which no rollback reaches (as of the last rollback or trim: `_reach` brings it up to date)
        self._dropped = 0
        self._dropped_tokens = 0
        self._floor = 0
        self._awaiting: bool = self.grammar.lazy
        # the last mask made, as words, and the state it was made for (at a fresh UTF-8 start)
        self._mask_state: State | None = None
        self._mask_words: memoryview = _NO_WORDS

    # -- questions (never change the state) --------------------------------------------------------

    @property
    def history(self) -> tuple[int, ...]:
        """The accepted tokens, in order (bytes given to `accept_bytes` are not tokens and not listed); with
        a rollback window, those of the steps it keeps: the ones a rollback may still undo."""
        return tuple(token for token in self._window_tokens() if token != _BYTES)

    @property
    def position(self) -> int:
        """How many tokens were accepted (those rolled back not counted), whether or not the rollback
        window still keeps them. Counts the steps kept: O(window)."""
        tokens = self._trail_tokens
        return self._dropped_tokens + len(tokens) - tokens.count(_BYTES)

    @property
    def stacks(self) -> StackSet:
        """The current stack set (grammar positions, bottom first); for inspection."""
        return self._state.stacks

    @property
    def partial_utf8(self) -> PartialUtf8:
        """The UTF-8 sequence the last piece left unfinished: (bits so far, bytes missing); (0, 0) if none."""
        return self._partial

    @property
    def awaiting_trigger(self) -> bool:
        """Whether a lazy grammar still waits for its trigger."""
        return self._awaiting

    def is_complete(self) -> bool:
        """Whether the grammar may end here: an empty stack is among the stacks, so end-of-generation
        tokens are allowed (also while a lazy grammar waits, when every token is)."""
        return self._awaiting or self._state.has_empty

    def allows(self, token: int) -> bool:
        """Whether llama.cpp's grammar sampler would leave `token`'s logit finite now. Changes nothing.

        Raises:
            TokenError: `token` is outside the vocabulary.
            LimitError: deciding it meets more than `max_stacks` stacks (an answer already known for this
                state, from an accept or a mask, is read instead).
        """
        token = _index(token)
        if not 0 <= token < self._n_vocab:
            raise self._outside(token)
        if self._awaiting:
            return True
        state, partial = self._state, self._partial
        if not partial[1]:
            if state is self._mask_state:  # the last mask was made here: its bit is the answer
                return bool((self._mask_words[token >> 5] >> (token & 31)) & 1)
            move = state.moves.get(token)
            if move is not None and move[3] <= self.max_stacks:
                return move[0]
        finished = self.grammar._masks.finished(state, partial)
        if finished is not None:  # a mask of this state was made: its bit is the answer
            return bool((finished.item(token >> 5) >> (token & 31)) & 1)
        kind = self.grammar._decoded.kind_of[token]
        if kind == END_OF_GENERATION:
            return state.has_empty
        if kind == NEVER:
            return False
        code_points, partial = self.grammar._decoded.decode(token, partial)
        if partial == INVALID:
            return False
        return state.walk(token, code_points, partial, self.max_stacks)[0]

    def mask(self, *, deadline: float | None = None) -> npt.NDArray[np.int32]:
        """The packed mask of every token `allows` allows (read-only; copy it to change it). Changes nothing.

        Raises:
            LimitError: deciding a token needs a stack set above `max_stacks` (masks taken from the
                grammar's caches may not need one where a fresh walk would).
            DeadlineError: making it was still going at `deadline` (time.monotonic()): the work stops
                there, and nothing changes.
        """
        grammar = self.grammar
        if self._awaiting:
            return grammar._decoded.all_allowed()
        state, partial = self._state, self._partial
        words = grammar._masks.mask(state, partial, self.max_stacks, deadline=deadline)
        if not partial[1]:
            self._mask_state, self._mask_words = state, words.data
        return words

    def mask_known(self) -> bool:
        """Whether `mask()` answers from what the grammar keeps, with no walk of the vocabulary: a lazy
        grammar before its trigger, or a state whose mask was made before. Changes nothing."""
        if self._awaiting:
            return True
        return self.grammar._masks.finished(self._state, self._partial) is not None

    def fill_mask(self, out: npt.NDArray[np.int32], index: int = 0) -> bool:
        """Write `mask()` into row `index` of `out`, as XGrammar's and llguidance's
        `fill_next_token_bitmask(bitmask, index)`. Changes nothing but that row.

        Args:
            out: int32 words, `(batch, words)` (a batch of masks, from `allocate_masks`) or `(words,)` (one
                row); a row has `ceil(n_vocab / 32)` words or more (the extra words get 0).
            index: the row to write (0 for a one-row buffer).

        Returns:
            Whether the mask needs applying: False when it allows every token (a lazy grammar waiting for
            its trigger), so the caller may skip applying it.

        Raises:
            InputError: `out` is not one or two dimensional, `index` is not one of its rows, or a row is
                too small.
            LimitError: as `mask()`.
        """
        if out.ndim == 1:
            if index != 0:
                raise InputError(f"a one-row mask buffer has no row {index}")
            row = out
        elif out.ndim == 2:
            if not 0 <= index < out.shape[0]:
                raise InputError(f"row {index} is outside a mask buffer of {out.shape[0]} rows")
            row = out[index]
        else:
            raise InputError(f"a mask buffer has one or two dimensions, not {out.ndim}")
        mask = self.mask()
        if row.shape == mask.shape:  # the usual buffer: rows of exactly the mask's size
            row[:] = mask
        elif row.size < mask.size:
            raise InputError(f"a mask needs {mask.size} words, the buffer's rows have {row.size}")
        else:
            row[: mask.size] = mask
            row[mask.size :] = 0
        if self._awaiting:
            return False
        # A mask forbids something whenever the vocabulary has a token never allowed, or end-of-generation
        # tokens while the grammar may not end: known without reading the mask. Only otherwise (rare) are
        # its words compared with the all-allowed mask's.
        decoded = self.grammar._decoded
        if decoded.has_never or (decoded.eog_tokens.size and not self._state.has_empty):
            return True
        return not np.array_equal(mask, decoded.all_allowed())

    # -- moves ----------------------------------------------------------------------------------

    def accept(self, token: int) -> bool:
        """Advance past `token` if the grammar allows it.

        Returns:
            True when accepted; False when rejected, with the state exactly as before.

        Raises:
            TokenError: `token` is outside the vocabulary.
            LimitError: the stacks would exceed `max_stacks` (nothing changes).
        """
        token = _index(token)
        if not 0 <= token < self._n_vocab:
            raise self._outside(token)
        if self._awaiting:
            return self._accept_awaiting(token)
        state, partial = self._state, self._partial
        # The path every generated token takes, with as few calls as it can: between two tokens a server
        # runs the model and other sessions, so this code and what it reads are mostly out of the CPU's
        # caches, and each function met costs its misses (about half a microsecond), whatever it does.
        after: State | None
        if partial[1]:
            _, after, after_partial, peak = self._move(state, token, partial)
        else:
            kept = state.moves.get(token)
            if kept is not None:  # a token from a fresh UTF-8 start, memoized on the state (`known_move`)
                _, number, after_partial, peak = kept
                after = None if number == DEAD else state.peers[number]
            else:
                decoded = self.grammar._decoded
                kind = decoded.kind_of[token]
                if kind in (END_OF_GENERATION, NEVER):
                    move = self._move(state, token, FRESH)
                else:  # `_move`, written out
                    code_points, after_partial = decoded.decode(token)
                    if after_partial == INVALID:
                        move = (False, None, FRESH, 0)
                    else:
                        move = state.move(token, code_points, after_partial, self.max_stacks)
                if len(state.moves) < MAX_MOVES:
                    state.keep_move(token, move)
                _, after, after_partial, peak = move
        if peak > self.max_stacks:
            raise LimitError(f"the grammar reached {peak} stacks, above the limit of {self.max_stacks}")
        if after is None:
            return False
        # _push, written out: this is the path every generated token takes
        context = (partial, False, len(self._buffered_tokens))
        contexts = self._trail_contexts
        if contexts and contexts[-1] == context:
            context = contexts[-1]
        contexts.append(context)
        self._trail_states.append(state)
        self._trail_tokens.append(token)
        if len(contexts) > self._trim_at:
            self._trim()
        self._mask_state, self._mask_words = None, _NO_WORDS
        self._state, self._partial = after, after_partial
        return True

    def _move(self, state: State, token: int, partial: PartialUtf8) -> Move:
        kind = self.grammar._decoded.kind_of[token]
        if kind == END_OF_GENERATION:  # taken when the grammar may end; no stack changes
            return (True, state, partial, 0) if state.has_empty else (False, None, partial, 0)
        if kind == NEVER:
            return False, None, partial, 0
        code_points, after_partial = self.grammar._decoded.decode(token, partial)
        if after_partial == INVALID:
            return False, None, partial, 0
        return state.move(token, code_points, after_partial, self.max_stacks)

    def accept_bytes(self, data: bytes, *, deadline: float | None = None) -> bool:
        """Advance past text that is not a token (a prefill): llama_grammar_accept_str.

        As llama.cpp: an unfinished last UTF-8 sequence is kept for what follows; bytes that are not
        UTF-8 make the whole of `data` count for nothing (and still succeed); token terminals take none
        of it. A lazy grammar's wait is neither ended nor fed.

        Returns:
            True when accepted; False (state unchanged) when no stack takes the text, where llama.cpp throws.

        Raises:
            LimitError: the stacks would exceed `max_stacks` (nothing changes).
            DeadlineError: still stepping at `deadline` (time.monotonic()); the clock is read every
                ACCEPT_BYTES_CHECK code points, and nothing changes.
        """
        code_points, partial = decode_utf8(bytes(data), self._partial)
        state: State | None = self._state
        for position, code_point in enumerate(code_points):
            assert state is not None
            if deadline is not None and position % ACCEPT_BYTES_CHECK == 0 and time.monotonic() > deadline:
                raise DeadlineError(f"taking the text ran past its time limit at code point {position}")
            state = state.step(code_point, self.max_stacks)
            if state is None:
                return False
        assert state is not None
        self._push(_BYTES)
        self._state, self._partial = state, (FRESH if partial == INVALID else partial)
        return True

    def _accept_awaiting(self, token: int) -> bool:
        piece = self.grammar.vocab.pieces[token]
        triggers = self.grammar._triggers
        buffered = False
        scan: TriggerScan | None = None
        if token in triggers.tokens:
            replay: list[tuple[int, bytes]] | None = [(token, piece)]
        else:
            # the piece joins the buffer for the look, and leaves it again unless the token is accepted;
            # the patterns read only what it adds, not the buffer again (trigger_regex.py)
            buffered = True
            begin = len(self._buffer)
            self._buffer += piece
            scan, start = triggers.advance(self._scan, self._buffer)
            replay = None
            if start >= 0:
                this = (token, begin, len(self._buffer))
                replay = triggers.replayed(self._buffer, [*self._buffered_from(start), this], start)
            del self._buffer[begin:]
        state: State | None = self._state
        partial = self._partial
        for replayed, replayed_piece in replay or ():
            assert state is not None
            code_points, partial = decode_utf8(replayed_piece, partial)
            state = state.accepted(replayed, code_points, self.max_stacks)
            if state is None:
                return False  # llama.cpp throws: the grammar refuses the text that triggered it
            partial = FRESH if partial == INVALID else partial
        self._push(token)
        if buffered:
            assert scan is not None
            self._buffer += piece
            self._buffered_tokens.append(token)
            self._buffered_ends.append(len(self._buffer))
            self._scan = scan
            if not len(self._buffered_tokens) % SCAN_EVERY:
                self._scans.append(scan)
        if replay is not None:
            assert state is not None
            self._state, self._partial, self._awaiting = state, partial, False
        return True

    def _buffered_from(self, start: int) -> list[BufferedToken]:
        # the buffered tokens whose piece ends past `start`, as Triggers.replayed reads them (it finds the
        # first again, and drops a token that ends before: here they are made only from the first on,
        # once, when the wait ends)
        tokens, ends = self._buffered_tokens, self._buffered_ends
        first = bisect_right(ends, start)
        return [(tokens[i], ends[i - 1] if i else 0, ends[i]) for i in range(first, len(tokens))]

    # -- history --------------------------------------------------------------------------------

    def fork(self) -> Matcher:
        """An independent copy: the same grammar, state, history and rollback window (what is left of it)."""
        twin = Matcher.__new__(Matcher)
        twin.grammar = self.grammar
        twin.max_stacks = self.max_stacks
        twin.max_rollback, twin._trim_at = self.max_rollback, self._trim_at
        twin._dropped, twin._dropped_tokens, twin._floor = self._dropped, self._dropped_tokens, self._floor
        twin._n_vocab = self._n_vocab
        twin._mask_state, twin._mask_words = self._mask_state, self._mask_words
        twin._state, twin._partial, twin._awaiting = self._state, self._partial, self._awaiting
        twin._trail_states = list(self._trail_states)
        twin._trail_contexts = list(self._trail_contexts)
        twin._trail_tokens = array("i", self._trail_tokens)
        twin._buffer = bytearray(self._buffer)
        twin._buffered_tokens = array("i", self._buffered_tokens)
        twin._buffered_ends = array("q", self._buffered_ends)
        twin._scan, twin._scans, twin._scan_base = self._scan, list(self._scans), self._scan_base
        return twin

    def rollback(self, n: int = 1) -> None:
        """Undo the last `n` (by default one) successful `accept` / `accept_bytes` calls.

        Raises:
            InputError: `n` is negative, more than were made, or more than the rollback window keeps
                (`max_rollback`); nothing changes.
        """
        steps = len(self._trail_tokens)
        taken = self._dropped + steps
        reach = self._reach()
        if not 0 <= n <= reach:
            if n < 0 or n > taken:
                raise InputError(f"cannot roll back {n} steps: {taken} were taken")
            raise InputError(
                f"cannot roll back {n} steps: the rollback window (max_rollback) keeps the last "
                f"{self.max_rollback} steps, and {reach} are left to undo"
            )
        if n == 0:
            return
        self._floor = taken - reach
        state = self._trail_states[-n]
        partial, awaiting, buffered = self._trail_contexts[-n]
        del self._trail_states[-n:], self._trail_contexts[-n:], self._trail_tokens[-n:]
        self._state, self._partial, self._awaiting = state, partial, awaiting
        del self._buffered_tokens[buffered:], self._buffered_ends[buffered:]
        del self._scans[(buffered - self._scan_base) // SCAN_EVERY + 1 :]
        del self._buffer[self._buffered_ends[-1] if buffered else 0 :]
        self._scan = self._scans[-1]
        if awaiting and buffered % SCAN_EVERY:
            # the search from the last scan kept, over the buffer cut back: where it stood then (no scan
            # is read once the wait is over)
            self._scan, start = self.grammar._triggers.advance(self._scan, self._buffer)
            assert start < 0, "a text read while waiting matched a trigger pattern"

    def reset(self) -> None:
        """Back to the start of the grammar, with an empty history."""
        self._trail_states.clear()
        self._trail_contexts.clear()
        del self._trail_tokens[:]
        self._buffer.clear()
        del self._buffered_tokens[:], self._buffered_ends[:]
        self._scan = self.grammar._triggers.start()
        self._scans = [self._scan]
        self._start()

    def _reach(self) -> int:
        # how many steps a rollback may undo now
        steps = len(self._trail_tokens)
        if self.max_rollback is None:
            return steps
        taken = self._dropped + steps
        return taken - max(self._floor, taken - self.max_rollback)

    def _window_tokens(self) -> array[int]:
        tokens = self._trail_tokens
        reach = self._reach()
        return tokens[len(tokens) - reach :] if reach < len(tokens) else tokens

    def _trim(self) -> None:
        # Drop the trail's steps below the floor (the window's oldest). The steps kept roll back no further
        # than the oldest one's context, so the trigger scans before its buffered count go too.
        tokens = self._trail_tokens
        drop = len(tokens) - self._reach()
        if drop <= 0:
            return
        contexts = self._trail_contexts
        oldest_buffered = contexts[drop][2] if drop < len(contexts) else len(self._buffered_tokens)
        self._dropped_tokens += drop - tokens[:drop].count(_BYTES)
        self._dropped += drop
        self._floor = self._dropped
        del self._trail_states[:drop], contexts[:drop], tokens[:drop]
        cut = (oldest_buffered - self._scan_base) // SCAN_EVERY
        if cut > 0:
            del self._scans[:cut]
            self._scan_base += cut * SCAN_EVERY

    def _push(self, token: int) -> None:
        context = (self._partial, self._awaiting, len(self._buffered_tokens))
        contexts = self._trail_contexts
        if contexts and contexts[-1] == context:
            context = contexts[-1]  # share the previous step's tuple: one reference, no new object
        contexts.append(context)
        self._trail_states.append(self._state)
        self._trail_tokens.append(token)
        if len(contexts) > self._trim_at:
            self._trim()
        self._mask_state, self._mask_words = None, _NO_WORDS  # not this state's: do not keep it alive

    def _outside(self, token: int) -> TokenError:
        return TokenError(f"token {token} is outside the vocabulary of {self._n_vocab}")

    def __repr__(self) -> str:
        waiting = ", awaiting trigger" if self._awaiting else ""
        steps = len(self._trail_tokens) + self._dropped
        return f"<Matcher {len(self._state.stacks)} stacks, {steps} steps{waiting}>"
