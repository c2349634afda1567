# Masks of one grammar, cached two ways so that most masks cost a few array ORs.
#
# Contract:
# - `MaskCache.mask(state, partial, limit)` is exactly `mask.compute_mask(state, partial, ...)`: the packed
#   mask of the tokens llama.cpp's apply allows (read-only).
# - Finished masks are kept by (state, partial), per grammar, up to `max_mask_bytes`; states are interned,
#   so a state seen before costs a dict lookup.
# - Per stack top (the top `CONTEXT_DEPTH` positions of a stack), the verdicts that do not depend on what
#   lies below are kept too (the idea of XGrammar's adaptive token mask cache): walking every token from
#   that top with an escape mark below (stacks.Rules.escape) splits the vocabulary into tokens allowed
#   whatever is below, tokens rejected whatever is below, and the "uncertain" few that reach below. A
#   token is allowed from a stack set when some stack allows it (llama_grammar_reject_candidates), so
#   the mask of a new state is the OR of its stack tops' allowed tokens, its token-topped stacks' tokens,
#   the end-of-generation tokens if it may end, and the uncertain tokens that a walk from the whole
#   state, over those tokens only, allows. A state with more than MAX_NEW_TOPS tops not seen before whose
#   class starts more than 1/FEW_SHARE of the rows (wide ones: each costs about what a walk of the whole
#   state does), or more than MAX_NEW_NARROW_TOPS new tops in all, is walked whole instead, without
#   learning them.
# - Verdicts are built a level at a time: the top (escape, p3, p2, p1) starts from the verdict of its
#   shorter top (escape, p2, p1): what that one allows or rejects whatever is below stays so, and only its
#   uncertain tokens are walked again, from the longer top. A stack no deeper than CONTEXT_DEPTH is its
#   own top, without a mark, built on the same positions with a mark, and leaves nothing uncertain.
# - Verdicts are keyed by the tops' structure (masks/structural_ids.py), not their positions, and kept per
#   vocabulary (masks/verdicts.py: the store its `DecodedVocab` owns): the string, number and value rules
#   that every converted JSON schema repeats are walked once per vocabulary, and a new grammar mostly
#   walks the few tokens its own literals and nesting decide.
# - Not every top is keyed: a longer top whose shorter one leaves no token uncertain has its verdict; one
#   whose shorter top leaves at most 1/FEW_SHARE of the vocabulary uncertain is walked over those rows,
#   and a shortest top whose whole walk moves at most that share of the rows past their first code
#   point (a narrow class on top: a literal's character) is walked whole, both without a key and kept
#   for the grammar alone (`max_own_bytes`, counted in `nbytes`): the structural ids of positions in a
#   grammar's schema-specific rules cost more than such walks, for verdicts no other grammar would
#   likely share.
# - The shortest top (escape, q) of a char terminal q is decided from the stack q leaves once it matched,
#   keyed by that stack's structure (masks/verdicts.py's `ShiftedVerdict`): a token whose first code
#   point q's class matches goes on from there with the rest of its code points, so two classes that leave
#   the same stack decide alike the tokens starting with a code point both match. The keys outside an
#   object's known set (llama.cpp's trie: `[^"a] char*`, `[^"b] char*`, ...) cost one walk per vocabulary,
#   and each class after it walks only the rows starting with a code point no class before it matched.
#   A longer marked top (escape, ..., q) whose class starts more than 1/FEW_SHARE of the rows is decided
#   the same way once its structural key misses, by the stack (escape, ..., after q): the trie's class
#   under the closing quote and the colon of `additional-kv` learns once per vocabulary, not once per
#   class. A top learned the usual way leaves what it decided of its class's rows there for the next,
#   once that stack's key is met a second time (`SharedVerdicts.met_before`): most such keys are one
#   top's alone (a string's class under one schema's property), and keeping each costs passes over the
#   vocabulary (a one-off count over bench_masks's 60 schemas of seed 11 on qwen2: 6,400 kept, about
#   0.3 ms each, for 230 keys ever met again).
# - First visits inside bounded repetitions (`x{0,n}`, unrolled by the parser into a chain of rules,
#   each position a structure of its own within the horizon) borrow from the loop `x*`: the top is also
#   keyed with its chains made loops (masks/structural_ids.py, `loops`), and every token that looks at no
#   more code points than the top's reach gets the loop's verdict, proved exact there. A verdict kept for
#   that key (a real loop's, whole; or one learned from a chain, under (LOOP_MARK, *ids), up to its
#   reach) then decides all but the longer tokens, which alone are walked from the top; when they are
#   more than 1/LOOP_SHARE of the vocabulary the top is walked as before. Each verdict learned from a
#   chain is kept for its loop too, up to its reach, so the next position of the chain (one repetition
#   fewer), or the same repetition in another grammar, finds it: a chain costs one walk, not one per
#   position.
# - A keyed top (escape, p, ...) whose shorter top leaves many rows uncertain (a whitespace run on top,
#   `[ \t]{0,20}`: every row starting with a space) walks only those that may go on below: a row the
#   shorter top left at the escape mark at one column alone goes on from (escape, p) there, so it is
#   rejected when p's stack cannot take its code point at that column (and has no token on top and no
#   way past p). The columns are learned once per shorter top's ids (`SharedVerdicts.escapes`, one walk
#   of its uncertain rows); rows met at several columns, or ending there, are walked as before.
# - Fixed-length repetitions of one char class (`[0-9a-f]{8}`, a UUID's groups) are inline, not chains of
#   links, so they get no loop; each position's rows are decided from the grammar's run counts instead
#   (masks/compute.py's `ClassRuns`, counted once per class and kept up to its bound, counted in
#   `nbytes`): a few passes over the rows a position walks, not a walk of them column by column.
# - The positions of a long bounded repetition (`char{0,255}`: 255 rules of the parser's) that no token of
#   the vocabulary tells apart, those more than its longest token's code points + 2 repetitions from the
#   end, are made one (grammar/chains.py): a state holding them has the mask of the state with them
#   aliased, composed once, so a string's first characters under a long maxLength share one mask, not
#   one composed per character. Each state's aliased state is kept (MAX_SAME_STATES, a count).
# - A minimum's copies of a rule reference (`char{32,32}`: llama.cpp's parser writes 32 references in a row)
#   are each a structure of their own, whose tops would each walk most of the vocabulary. A top whose
#   next position starts m such copies borrows the verdict of a known top with more copies before it
#   (the previous character's, usually): a token of at most m code points never gets past the copies from
#   either, so only the longer tokens are walked (`_from_copy`), when they are at most 1/COPY_SHARE of
#   the vocabulary.
# - After an unfinished UTF-8 sequence (rare: a token cut a character) the mask is walked whole.
# - Every cache is an `LruCache` (engine/lru.py), dropping its least recently used entries beyond its
#   bound (bytes of arrays for masks and verdicts, a count for the per-grammar shortcut to them); the
#   answers never depend on them. The masks, a grammar's own verdicts and the shortcuts are owned by the
#   `MaskCache` (one per grammar), the shared verdicts by the vocabulary: nothing here lives in the module.
from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from constraintd.engine.grammar.chains import ChainAliases, takes_input
from constraintd.engine.grammar.elements import RULE_REF, TOKEN
from constraintd.engine.grammar.stack_sets import State, StateTable
from constraintd.engine.grammar.stacks import CharClass, Stack
from constraintd.engine.grammar.utf8 import FRESH, PartialUtf8
from constraintd.engine.lru import LruCache
from constraintd.engine.masks.bitmask import allow_tokens, mask_words, pack_mask
from constraintd.engine.masks.compute import (
    ClassRuns,
    Escapes,
    check_deadline,
    class_members,
    compute_mask,
    escape_columns,
    rows_past_first,
    rows_without,
    union_rows,
    walk,
)
from constraintd.engine.masks.structural_ids import Structure
from constraintd.engine.masks.verdicts import (
    IDS,
    LOOP_MARK,
    NBYTES,
    REACH,
    SHIFT_MARK,
    UNCERTAIN,
    WORDS,
    EscapeIndex,
    SharedVerdicts,
    ShiftedVerdict,
    TopVerdict,
    top_verdict,
)
from constraintd.engine.vocab.decoded import ColumnTable, DecodedVocab

__all__ = [
    "CONTEXT_DEPTH",
    "COPY_SHARE",
    "FEW_SHARE",
    "LOOP_SHARE",
    "MAX_COPIES_BACK",
    "MAX_MASK_BYTES",
    "MAX_NEW_NARROW_TOPS",
    "MAX_NEW_TOPS",
    "MAX_OWN_BYTES",
    "MAX_SAME_STATES",
    "MaskCache",
]

# Positions a stack top keeps (the stack's own positions when it is no deeper).
CONTEXT_DEPTH: Final = 4
# Tops not seen before that one mask may learn: wide ones, and in all; above, the state is walked whole.
MAX_NEW_TOPS: Final = 16
MAX_NEW_NARROW_TOPS: Final = 64
# A top borrows its loop's verdict when at most 1/LOOP_SHARE of the vocabulary is left to walk.
LOOP_SHARE: Final = 16
# A longer top is walked from its shorter one's uncertain rows, without a structural key, when they are at
# most 1/FEW_SHARE of the vocabulary.
FEW_SHARE: Final = 64
# Default bound of a grammar's finished masks.
MAX_MASK_BYTES: Final = 4 << 20
# Default bound of the verdicts a grammar keeps for itself alone (tops walked without a structural key).
MAX_OWN_BYTES: Final = 4 << 20
# States a grammar remembers the aliased state of (grammar/chains.py).
MAX_SAME_STATES: Final = 4096
# How far back along copies of one rule reference a top looks for a known top with more copies.
MAX_COPIES_BACK: Final = 64
# A copy borrows that top's verdict when at most 1/COPY_SHARE of the vocabulary is left to walk.
COPY_SHARE: Final = 8

Words = npt.NDArray[np.int32]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class MaskCache:
    """The masks of one grammar on its vocabulary (see the module comment)."""

    __slots__ = (
        "_chains",
        "_masks",
        "_own",
        "_runs",
        "_same",
        "_tops",
        "loops",
        "shared",
        "states",
        "structure",
        "vocab",
    )

    def __init__(
        self,
        states: StateTable,
        vocab: DecodedVocab,
        *,
        max_mask_bytes: int = MAX_MASK_BYTES,
        max_tops: int = 2048,
        max_own_bytes: int = MAX_OWN_BYTES,
        shared: SharedVerdicts | None = None,
    ) -> None:
        self.states = states
        self.vocab = vocab
        self.structure: Structure | None = None  # built on first use: it needs the vocabulary's table
        self.loops: Structure | None = None  # the same, with chains made loops
        self.shared = shared if shared is not None else vocab.verdicts()
        self._masks: LruCache[tuple[State, PartialUtf8], Words] = LruCache(max_mask_bytes)
        # stack top -> its verdict (a shortcut past the structural key, for this grammar's tops), counted
        self._tops: LruCache[Stack, TopVerdict] = LruCache(max_tops)
        # stack top -> its verdict when no structural key keeps it (`_from_shorter`): this grammar's alone,
        # sized by the arrays it holds alone
        self._own: LruCache[Stack, TopVerdict] = LruCache(max_own_bytes)
        # per char class, the rows' leading code points in it: fixed-length runs of a class decided
        # without a walk of each position (masks/compute.py); built on first use, as `structure`
        self._runs: ClassRuns | None = None
        # the positions of long bounded repetitions no token tells apart (grammar/chains.py), built on
        # first use, and per shared state met, the state whose mask it shares (itself when none), counted
        self._chains: ChainAliases | None = None
        self._same: LruCache[State, State] = LruCache(MAX_SAME_STATES)

    def mask(self, state: State, partial: PartialUtf8, limit: int, *, deadline: float | None = None) -> Words:
        """The packed mask of the tokens llama.cpp allows from `state` after `partial` (read-only). A
        state of its session alone (`State.shared` False) gets its mask made and not kept.

        Raises:
            LimitError: a state met inside a token has more than `limit` stacks.
            DeadlineError: the work was still going at `deadline` (time.monotonic()); it stops there, and
                what it learnt whole is kept.
        """
        key = (state, partial)
        mask = self._masks.get(key)
        if mask is None:
            if partial[1] <= 0:
                same = self._same_state(state, limit)
                if same is not state:
                    return self.mask(same, partial, limit, deadline=deadline)
            check_deadline(deadline)
            if partial[1] > 0:
                mask = compute_mask(state, partial, self.vocab, limit, deadline=deadline)
            else:
                mask = self._compose(state, limit, deadline)
                mask.flags.writeable = False
            if state.shared:
                self._masks.put(key, mask, mask.nbytes)
        return mask

    def finished(self, state: State, partial: PartialUtf8) -> Words | None:
        """The mask kept for `state` after `partial`, if one is (no walk, no change to the order kept)."""
        found = self._masks.peek((state, partial))
        if found is None and partial[1] <= 0:
            same = self._same.peek(state)
            if same is not None and same is not state:
                found = self._masks.peek((same, partial))
        return found

    def learn(self, stack: Stack, limit: int, *, deadline: float | None = None) -> None:
        """Learn and keep the verdict of a char-topped stack's top, as a mask of a state holding it would
        (masks/ahead.py's lookahead, before any state holding it is met). Changes no answer.

        Raises:
            LimitError: a state met on the way has more than `limit` stacks.
            DeadlineError: the work was still going at `deadline` (or an `Interruption` stopped it); what
                it learnt whole is kept.
        """
        self._top(self._top_of(self.same_stack(stack)), limit, deadline)

    def same_stack(self, stack: Stack) -> Stack:
        """`stack` with the positions of long bounded repetitions that no token of the vocabulary tells
        apart made one (grammar/chains.py): a stack whose verdicts are the same."""
        chains = self._chain_aliases()
        return chains.same_stack(stack) if chains.active else stack

    def _same_state(self, state: State, limit: int) -> State:
        # the state whose mask `state` has, by grammar/chains.py's aliases (the state itself when it has
        # no aliased position): a string's first characters under a long maxLength share one mask
        chains = self._chain_aliases()
        if not chains.active:
            return state
        same = self._same.get(state)
        if same is None:
            stacks = chains.same_stacks(state.stacks)
            found = state if stacks is None else self.states.intern(stacks, limit)
            assert found is not None  # as many stacks as `state`, or fewer where two became one
            same = found
            if state.shared and same.shared:  # a session's private state is not the grammar's to keep
                self._same.put(state, same, 1)
        return same

    def _chain_aliases(self) -> ChainAliases:
        chains = self._chains
        if chains is None:
            # a token looks at most at one terminal past its code points: deeper repetitions look alike
            horizon = len(self.vocab.fresh_table().columns) + 2
            chains = self._chains = ChainAliases(self.states.rules, horizon)
        return chains

    def _top_of(self, stack: Stack) -> Stack:
        # the top a stack's verdict is kept for: the stack itself when it is short, else its last
        # CONTEXT_DEPTH positions under an escape mark
        return stack if len(stack) <= CONTEXT_DEPTH else (self.states.rules.escape, *stack[-CONTEXT_DEPTH:])

    def _compose(self, state: State, limit: int, deadline: float | None) -> Words:
        top_of = self._top_of
        tops = {top_of(stack) for stacks in state.by_top.values() for stack in stacks}
        new = [top for top in tops if top not in self._tops and top not in self._own]
        if len(new) > MAX_NEW_TOPS and (len(new) > MAX_NEW_NARROW_TOPS or self._wide(new) > MAX_NEW_TOPS):
            return compute_mask(state, FRESH, self.vocab, limit, deadline=deadline)
        vocab = self.vocab
        table = vocab.fresh_table()
        words = np.zeros(mask_words(vocab.n_tokens), dtype=np.int32)
        extra: list[IntArray] = []  # more allowed token ids
        uncertain: list[IntArray] = []
        # verdicts built on one another share their words: OR each array once (held here, so that an id
        # is not reused by another array while this runs)
        verdicts = [self._top(top, limit, deadline) for top in tops]
        ored: set[int] = set()
        for verdict in verdicts:
            allowed, ids, left = verdict[WORDS], verdict[IDS], verdict[UNCERTAIN]
            if allowed is not None and id(allowed) not in ored:
                ored.add(id(allowed))
                words |= allowed
            if ids.size:
                extra.append(ids)
            if left.size:
                uncertain.append(left)
        if state.has_empty:
            extra.append(vocab.eog_tokens)
        # token-topped stacks take any token with a code point, by id alone
        with_code_points = table.ids[: table.count_from[0] if table.count_from else 0]
        for kind, value, _ in state.token_tops:
            if kind == TOKEN:
                extra.append(with_code_points[with_code_points == value])
            else:
                extra.append(with_code_points[with_code_points != value])
        if extra:
            allow_tokens(words, extra[0] if len(extra) == 1 else np.concatenate(extra))
        rows = union_rows(uncertain, table.ids.size)
        if rows.size:
            ids = table.ids[rows]
            rows = rows[((words[ids >> 5] >> (ids & 31)) & 1) == 0]  # not allowed already
        if rows.size:
            found, _ = walk(
                table, table.columns, state, limit, rows=rows, runs=self._class_runs(), deadline=deadline
            )
            allow_tokens(words, table.ids[found])
        return words

    def _top(self, top: Stack, limit: int, deadline: float | None) -> TopVerdict:
        verdict = self._tops.get(top)
        if verdict is None:
            verdict = self._own.get(top)
        if verdict is None:
            check_deadline(deadline)
            shorter = self._shorter(top, limit, deadline)
            if shorter is None and self._narrow(top, limit):
                # the shortest top, of a narrow class: its whole walk touches few rows, kept as below
                table = self.vocab.fresh_table()
                start = self.states.intern([top], limit)
                assert start is not None
                allowed_rows, uncertain = walk(table, table.columns, start, limit, deadline=deadline)
                verdict = self._verdict(None, table.ids[allowed_rows], uncertain)
                self._own.put(top, verdict, verdict[NBYTES])
            elif shorter is not None and shorter[UNCERTAIN].size == 0:
                verdict = shorter  # it decides every token whatever lies below: so does the longer top
                self._tops.put(top, verdict, 1)
            elif (
                shorter is not None
                and shorter[UNCERTAIN].size * FEW_SHARE <= self.vocab.fresh_table().ids.size
            ):
                # Few rows left to walk: walked from this top without its structural key (the ids of
                # positions deep in a grammar, whose forms run through its schema-specific rules, cost
                # more than such a walk), and kept for this grammar alone.
                verdict = self._walk_uncertain(top, shorter, limit, deadline)
                self._own.put(top, verdict, verdict[NBYTES])
            else:
                verdict = self._keyed_top(top, limit, deadline)
                self._tops.put(top, verdict, 1)
        return verdict

    def _wide(self, tops: list[Stack]) -> int:
        # how many of `tops` have a class that starts more than 1/FEW_SHARE of the rows (counted from the
        # rows' groups by first code point: no walk)
        runs = self._class_runs()
        rows = runs.table.ids.size
        rules = self.states.rules
        return sum(runs.count_starting(rules.char_class(top[-1])) * FEW_SHARE > rows for top in tops)

    def _narrow(self, top: Stack, limit: int) -> bool:
        # whether a whole walk from the shortest top (escape, p) moves at most 1/FEW_SHARE of the rows past
        # their first code point, deciding no token by id (a literal's character, a digit)
        start = self.states.intern([top], limit)
        assert start is not None
        if start.token_tops or start.has_empty:
            return False
        table = self.vocab.fresh_table()
        return rows_past_first(table, start, limit) * FEW_SHARE <= table.ids.size

    def _shorter(self, top: Stack, limit: int, deadline: float | None) -> TopVerdict | None:
        # the verdict of the top one position shorter (None for the shortest, which is walked whole)
        escape = self.states.rules.escape
        if top[0] == escape:
            return None if len(top) == 2 else self._top((escape, *top[2:]), limit, deadline)
        return self._top((escape, *top), limit, deadline)

    def _keyed_top(self, top: Stack, limit: int, deadline: float | None) -> TopVerdict:
        # a top's verdict by its structural key: shared by every grammar on the vocabulary
        structure = self.structure
        if structure is None:
            # a token matches at most as many char terminals as it has code points, then looks at one more
            horizon = len(self.vocab.fresh_table().columns) + 1
            self.loops = Structure(self.states.rules, horizon, self.shared.forms, loops=True)
            structure = self.structure = Structure(self.states.rules, horizon, self.shared.forms)
        key = structure.stack(top)
        verdict = self.shared.get(key)
        if verdict is None:
            shift = self._long_shift(top)
            if shift is not None:
                verdict = self._from_long_shift(top, *shift, limit, deadline)
            if verdict is not None:
                self.shared.put(key, verdict, verdict[NBYTES])
            else:
                verdict = self._learn_top(top, key, limit, deadline)  # kept under `key` there
                if shift is not None and self.shared.met_before(shift[0]):
                    self._keep_long_shift(verdict, *shift)
        return verdict

    def _long_shift(self, top: Stack) -> tuple[tuple[int, ...], CharClass] | None:
        # For a marked top longer than the shortest, (escape, ..., q), whose q is a wide char class (one
        # that starts more than 1/FEW_SHARE of the rows): the key of the stack q leaves once it matched,
        # and q's class. As for the shortest top (`_shifted`), a row starting with a code point of the
        # class goes on from that stack with the rest of its code points, and any other row with a code
        # point dies at q. A key trie's `[^"a] char*`, `[^"b] char*`, ... below the closing quote and the
        # colon of `additional-kv` leave stacks with one key, so they share one verdict per vocabulary.
        # None for any other top (a narrow class's own walk costs little: it is not kept).
        rules = self.states.rules
        if len(top) < 3 or top[0] != rules.escape:
            return None
        char_class = rules.classes[top[-1]]
        if char_class is None:
            return None
        table = self.vocab.fresh_table()
        if self._class_runs().count_starting(char_class) * FEW_SHARE <= table.ids.size:
            return None
        assert self.structure is not None
        follow = rules.after[top[-1]]
        left = top[:-1] if follow < 0 else (*top[:-1], follow)
        return (SHIFT_MARK, *self.structure.stack(left)), char_class

    def _from_long_shift(
        self, top: Stack, key: tuple[int, ...], char_class: CharClass, limit: int, deadline: float | None
    ) -> TopVerdict | None:
        # the verdict of `top` (see `_long_shift`) from the shifted verdict kept under `key`, walking only
        # the rows starting with a code point it does not decide (and the bare unfinished sequences,
        # judged against the class itself); None when none is kept, or those rows are many
        known = self.shared.shifted.get(key)
        if known is None:
            return None
        table = self.vocab.fresh_table()
        in_class = class_members(char_class, table.first_code_points)
        rows = np.flatnonzero((in_class & ~known.firsts)[table.first_index])
        if rows.size * FEW_SHARE > table.ids.size:
            return None
        bare = table.row_groups().bare_rows
        allowed_rows, uncertain = self._walk_rows(
            top, np.concatenate((rows, bare)) if bare.size else rows, limit, deadline
        )
        verdict = self._with_known(known, in_class, allowed_rows, uncertain)
        if rows.size:
            n_first = table.count_from[0] if table.count_from else 0
            allowed, left = _row_flags(allowed_rows, n_first), _row_flags(uncertain, n_first)
            self._keep_shifted(key, in_class, allowed, left)
        return verdict

    def _keep_long_shift(self, verdict: TopVerdict, key: tuple[int, ...], char_class: CharClass) -> None:
        # what `verdict`, the whole verdict of a top of `char_class` whose terminal leaves the stack of
        # `key`, says of the rows starting with a code point of the class, kept under `key`
        table = self.vocab.fresh_table()
        n_first = table.count_from[0] if table.count_from else 0
        in_class = class_members(char_class, table.first_code_points)
        rows_in = in_class[table.first_index]
        words, ids = verdict[WORDS], verdict[IDS]
        tokens = table.ids[:n_first]
        allowed = np.zeros(n_first, dtype=np.bool_)
        if words is not None:
            allowed |= ((words[tokens >> 5] >> (tokens & 31)) & 1).astype(np.bool_)
        if ids.size:
            rows = table.row_of[ids]
            allowed[rows[(rows >= 0) & (rows < n_first)]] = True
        uncertain = _row_flags(verdict[UNCERTAIN], n_first)
        self._keep_shifted(key, in_class, allowed & rows_in, uncertain & rows_in)

    def _learn_top(self, top: Stack, key: tuple[int, ...], limit: int, deadline: float | None) -> TopVerdict:
        # the verdict of a top not seen on this vocabulary: from its loop's where that leaves few tokens
        # to walk (see the module comment), else walked; kept by its key, and for its loop up to its reach
        assert self.loops is not None
        loop_key, reach = self.loops.stack_reach(top)
        table = self.vocab.fresh_table()
        few = table.ids.size // LOOP_SHARE
        if loop_key == key or reach <= 0:
            walked = self._walk_top(top, limit, deadline)
            self.shared.put(key, walked, walked[NBYTES])
            return walked
        known = self.shared.get(loop_key)  # a real loop's verdict: it holds for every token
        if known is None:
            known = self.shared.get((LOOP_MARK, *loop_key))
        verdict = None
        if known is not None:
            shared_reach = min(reach, known[REACH])
            if _count_looking_past(table, shared_reach) <= few:  # counted first: rows only when few
                verdict = self._from_loop(top, known, _looking_past(table, shared_reach), limit, deadline)
        if verdict is None:
            verdict = self._walk_top(top, limit, deadline)
        self.shared.put(key, verdict, verdict[NBYTES])
        if (known is None or known[REACH] < reach) and _count_looking_past(table, reach) <= few:
            words, ids, uncertain, nbytes, _ = verdict
            self.shared.put((LOOP_MARK, *loop_key), top_verdict(words, ids, uncertain, nbytes, reach), nbytes)
        return verdict

    def _from_loop(
        self, top: Stack, known: TopVerdict, rows: IntArray, limit: int, deadline: float | None
    ) -> TopVerdict:
        # `known` on every token but those of `rows` (the ones looking past its reach, or past the
        # copies `_from_copy` borrows across), which are walked
        table = self.vocab.fresh_table()
        allowed_rows, uncertain = self._walk_rows(top, rows, limit, deadline)
        walked = table.ids[rows]
        words = None
        known_words = known[WORDS]
        if known_words is not None:
            words = known_words.copy()
            np.bitwise_and.at(
                words.view(np.uint32), walked >> 5, ~np.left_shift(1, walked & 31).astype(np.uint32)
            )
        n_tokens, n_rows = self.vocab.n_tokens, table.ids.size
        ids = rows_without(known[IDS], walked, n_tokens)
        kept = rows_without(known[UNCERTAIN], rows, n_rows)
        return self._verdict(
            words, union_rows([ids, table.ids[allowed_rows]], n_tokens), union_rows([kept, uncertain], n_rows)
        )

    def _walk_top(self, top: Stack, limit: int, deadline: float | None) -> TopVerdict:
        escape = self.states.rules.escape
        table = self.vocab.fresh_table()
        start = self.states.intern([top], limit)
        assert start is not None
        marked = top[0] == escape
        if marked and len(top) == 2:
            return self._shifted(top, limit, deadline)
        # built on (escape, p2, p1) for (escape, p3, p2, p1), and on (escape, p3, p2, p1) for the whole
        # stack (p3, p2, p1)
        shorter = self._top((escape, *top[2:]) if marked else (escape, *top), limit, deadline)
        if shorter[UNCERTAIN].size == 0:
            return shorter
        if shorter[UNCERTAIN].size * 2 > table.ids.size:
            copied = self._from_copy(top, limit, deadline)
            if copied is not None:
                return copied
            # most of the vocabulary is left to walk: a whole walk, which moves column 0 by first code
            # point instead of row by row, costs less (and decides the rest again, alike)
            allowed_rows, uncertain = walk(table, table.columns, start, limit, deadline=deadline)
            return self._verdict(None, table.ids[allowed_rows], uncertain)
        return self._walk_uncertain(top, shorter, limit, deadline, keyed=True)

    def _from_copy(self, top: Stack, limit: int, deadline: float | None) -> TopVerdict | None:
        # A top (..., p, q) whose p is the first of m copies in a row of one rule reference R that takes
        # a code point or more (`S{m,m}` copies S inline: `char{32,32}`), when a top with more copies,
        # (..., p - j, q), is known: a token of at most m code points never gets past the copies from
        # either, so it is decided alike; only the longer ones are walked. None when there is no such
        # top, or too many long tokens (a whole walk then costs less).
        rules = self.states.rules
        if len(top) < 2 or top[-2] == rules.escape:
            return None
        kinds, values = rules.kinds, rules.values
        p = top[-2]
        element = (kinds[p], values[p])
        if element[0] != RULE_REF:
            return None
        known = None
        before = p - 1  # the nearest known top with more copies: a token may take several at once
        while known is None and p - before <= MAX_COPIES_BACK and (kinds[before], values[before]) == element:
            wider = (*top[:-2], before, top[-1])
            known = self._tops.peek(wider)
            if known is None:
                known = self._own.peek(wider)
            before -= 1
        if known is None or not takes_input(rules, (p,)):
            return None
        copies = 1
        while (kinds[p + copies], values[p + copies]) == element:
            copies += 1
        table = self.vocab.fresh_table()
        if _count_looking_past(table, copies) * COPY_SHARE > table.ids.size:
            return None
        return self._from_loop(top, known, _looking_past(table, copies), limit, deadline)

    def _shifted(self, top: Stack, limit: int, deadline: float | None) -> TopVerdict:
        # The shortest top (escape, q), q a char terminal of class C: a row whose first code point c is in
        # C goes on from the stack q leaves, (escape, after q), with the rest of its code points; any
        # other row with a code point dies there. So the rows starting with a code point that C and a
        # class met before with the same stack after it both match are decided as they were then (the
        # shifted verdict keyed by that stack's ids); the others, and the rows of a bare unfinished
        # sequence (judged against C itself), are walked, and what they teach is kept for the next class.
        rules = self.states.rules
        table = self.vocab.fresh_table()
        start = self.states.intern([top], limit)
        assert start is not None and self.structure is not None
        follow = rules.after[top[1]]
        key = (SHIFT_MARK, *self.structure.stack((top[0],) if follow < 0 else (top[0], follow)))
        known = self.shared.shifted.get(key)
        n_first = table.count_from[0] if table.count_from else 0
        in_class = class_members(rules.char_class(top[1]), table.first_code_points)
        rows = None if known is None else np.flatnonzero((in_class & ~known.firsts)[table.first_index])
        if rows is None or rows.size * 2 > table.ids.size:
            # a whole walk moves column 0 by first code point, not row by row: it costs less when most
            # rows are left to walk (and decides the known ones again, alike)
            allowed_rows, uncertain = walk(table, table.columns, start, limit, deadline=deadline)
            verdict = self._verdict(None, table.ids[allowed_rows], uncertain)
        else:
            assert known is not None
            bare = table.row_groups().bare_rows  # a bare unfinished sequence, judged against C itself
            allowed_rows, uncertain = walk(
                table,
                table.columns,
                start,
                limit,
                rows=np.concatenate((rows, bare)) if bare.size else rows,
                runs=self._class_runs(),
                deadline=deadline,
            )
            verdict = self._with_known(known, in_class, allowed_rows, uncertain)
        if not (in_class.any() if rows is None else rows.size):
            return verdict  # nothing new to keep
        self._keep_shifted(key, in_class, _row_flags(allowed_rows, n_first), _row_flags(uncertain, n_first))
        return verdict

    def _with_known(
        self, known: ShiftedVerdict, in_class: BoolArray, allowed_rows: IntArray, uncertain: IntArray
    ) -> TopVerdict:
        # the verdict of a top whose class starts with the code points `in_class` marks: its rows that
        # `known` decides, as it decides them, and the rows walked from the top (`allowed_rows` allowed,
        # `uncertain`)
        table = self.vocab.fresh_table()
        have = (in_class & known.firsts)[table.first_index]
        return self._verdict(
            None,
            table.ids[np.concatenate((np.flatnonzero(known.allowed & have), allowed_rows))],
            union_rows([np.flatnonzero(known.uncertain & have), uncertain], table.ids.size),
        )

    def _keep_shifted(
        self, key: tuple[int, ...], in_class: BoolArray, allowed: BoolArray, uncertain: BoolArray
    ) -> None:
        # keeps under `key` what a top of a class starting with the code points `in_class` marks decided
        # (`allowed`, `uncertain`: per row with a code point), with what was kept there before (the rows
        # both decide, they decide alike)
        shared = self.shared.shifted
        known = shared.get(key)
        firsts = in_class
        if known is not None:
            firsts = known.firsts | in_class
            allowed = allowed | known.allowed
            uncertain = uncertain | known.uncertain
            shared.pop(key)
        learned = ShiftedVerdict.of(firsts, allowed, uncertain)
        shared.put(key, learned, learned.nbytes)

    def _walk_uncertain(
        self, top: Stack, shorter: TopVerdict, limit: int, deadline: float | None, *, keyed: bool = False
    ) -> TopVerdict:
        # `shorter`'s verdict, with the rows it leaves uncertain walked from `top` (when `top` is keyed,
        # only those that may go on below `shorter`: see the module comment)
        table = self.vocab.fresh_table()
        rows = shorter[UNCERTAIN]
        if keyed and top[0] == self.states.rules.escape and len(top) > 2:
            rows = self._going_below(top, rows, limit, deadline)
        allowed_rows, uncertain = self._walk_rows(top, rows, limit, deadline)
        ids = table.ids[allowed_rows]
        if shorter[IDS].size:
            ids = union_rows([shorter[IDS], ids], self.vocab.n_tokens)
        return self._verdict(shorter[WORDS], ids, uncertain)

    def _walk_rows(
        self, top: Stack, rows: IntArray, limit: int, deadline: float | None, escapes: Escapes | None = None
    ) -> tuple[IntArray, IntArray]:
        # `walk` of `rows` from the stack `top` alone
        table = self.vocab.fresh_table()
        start = self.states.intern([top], limit)
        assert start is not None
        runs = self._class_runs()
        return walk(
            table, table.columns, start, limit, rows=rows, runs=runs, deadline=deadline, escapes=escapes
        )

    def _going_below(self, top: Stack, rows: IntArray, limit: int, deadline: float | None) -> IntArray:
        # Of `rows`, the uncertain rows of top (escape, p, ...)'s shorter top (escape, ...), those a walk
        # from `top` must take: all but the ones whose code point, at every column where they met the
        # mark, the stacks of (escape, p) cannot take. Those are rejected from `top`: its paths are the
        # shorter top's, and the ones that reached the mark go on from (escape, p) at that column.
        rules = self.states.rules
        below = self.states.intern(rules.advance_stack((rules.escape, top[1])), limit)
        if below is None or below.token_tops or below.has_escape or below.has_empty:
            return rows
        index = self._escape_index((rules.escape, *top[2:]), rows, limit, deadline)
        bounds, after = below.segments(limit)
        # interval i of `below` holds the code points [bounds[i - 1], bounds[i]): index.points[edges[i]:
        # edges[i + 1]]
        edges = np.empty(bounds.size + 2, dtype=np.int64)
        edges[0], edges[-1] = 0, index.points.size
        edges[1:-1] = np.searchsorted(index.points, bounds, side="left")
        going = [index.unknown]
        for interval, state in enumerate(after):
            if state is not None and edges[interval] < edges[interval + 1]:
                going.append(index.by_point[edges[interval] : edges[interval + 1]])
        return union_rows([array.astype(np.int64) for array in going], self.vocab.fresh_table().ids.size)

    def _escape_index(
        self, shorter: Stack, rows: IntArray, limit: int, deadline: float | None
    ) -> EscapeIndex:
        # where the rows `shorter` leaves uncertain (`rows`) met the escape mark: learned by one walk per
        # ids of `shorter`, shared by the vocabulary's grammars
        assert self.structure is not None
        key = self.structure.stack(shorter)
        shared = self.shared.escapes
        kept = shared.get(key)
        if kept is not None and (kept.rows is rows or np.array_equal(kept.rows, rows)):
            return kept
        table = self.vocab.fresh_table()
        escapes: Escapes = []
        self._walk_rows(shorter, rows, limit, deadline, escapes)
        met, met_at = escape_columns(escapes)
        indexed = np.zeros(table.ids.size, dtype=np.bool_)
        indexed[rows] = True
        inside = indexed[met]  # not the rows the walk allowed on another path
        met, met_at = met[inside], met_at[inside]
        recorded = np.zeros(table.ids.size, dtype=np.bool_)
        recorded[met] = True
        unknown = union_rows([met[met_at < 0], rows[~recorded[rows]]], table.ids.size)
        known = met_at >= 0
        met, met_at = met[known], met_at[known]
        points = np.empty(met.size, dtype=np.int64)
        for column in np.flatnonzero(np.bincount(met_at)).tolist() if met.size else ():
            here = met_at == column
            points[here] = table.columns[column][met[here]]
        order = np.argsort(points, kind="stable")
        index = EscapeIndex(
            rows, unknown.astype(np.int32), met[order].astype(np.int32), points[order].astype(np.int32)
        )
        for array in (index.unknown, index.by_point, index.points):
            array.flags.writeable = False
        shared.put(key, index, index.nbytes)
        return index

    def _class_runs(self) -> ClassRuns:
        runs = self._runs
        if runs is None:
            runs = self._runs = ClassRuns(self.vocab.fresh_table())
        return runs

    def _verdict(self, words: Words | None, ids: IntArray, uncertain: IntArray) -> TopVerdict:
        if ids.size * 64 >= self.vocab.n_tokens:  # a mask takes less room than the ids (in any order)
            bits = np.zeros(self.vocab.n_tokens, dtype=np.bool_)
            bits[ids] = True
            own = pack_mask(bits)
            words = own if words is None else words | own
            ids = np.zeros(0, dtype=np.int64)
            nbytes = words.nbytes + uncertain.nbytes
        else:
            ids = np.sort(ids)
            nbytes = ids.nbytes + uncertain.nbytes
        for array in (words, ids, uncertain):
            if array is not None:
                array.flags.writeable = False
        return top_verdict(words, ids, uncertain, nbytes)

    def __len__(self) -> int:
        return len(self._masks)

    @property
    def nbytes(self) -> int:
        """Bytes of the finished masks, of the verdicts kept for this grammar alone and of its run counts
        (their arrays only, not the dicts around them)."""
        runs, chains = self._runs, self._chains
        return (
            self._masks.size
            + self._own.size
            + (runs.nbytes if runs is not None else 0)
            + (chains.nbytes if chains is not None else 0)
        )

    def forget_masks(self) -> None:
        """Drops the finished masks (not the per-top verdicts): the next masks are composed anew."""
        self._masks.clear()

    @property
    def tops(self) -> int:
        """How many stack tops this grammar has met and keeps a shortcut to."""
        return len(self._tops)


def _row_flags(rows: IntArray, n_first: int) -> BoolArray:
    # per row with a code point (the first `n_first` of the table), whether it is among `rows`
    flags = np.zeros(n_first, dtype=np.bool_)
    flags[rows[rows < n_first]] = True
    return flags


def _past(table: ColumnTable, reach: int) -> tuple[int, int]:
    # rows [0, more) have more code points than `reach`; rows [more, end) exactly `reach` (rows are sorted
    # longest first), and of those only the ones ending in an unfinished sequence look past it
    count_from = table.count_from
    more = int(count_from[reach]) if reach < len(count_from) else 0
    end = int(count_from[reach - 1]) if reach - 1 < len(count_from) else 0
    return more, max(end, more)


def _count_looking_past(table: ColumnTable, reach: int) -> int:
    # how many rows `_looking_past` gives, without making them: a short reach leaves most of the
    # vocabulary past it, and a first visit must not pay for an array of it only to learn that
    more, end = _past(table, reach)
    return more + int(np.count_nonzero(table.partials[more:end]))


def _looking_past(table: ColumnTable, reach: int) -> IntArray:
    # the rows (ascending) of tokens that look at more than `reach` terminals: more code points, or as
    # many and an unfinished sequence after them
    more, end = _past(table, reach)
    as_many = np.arange(more, end, dtype=np.int64)
    return np.concatenate((np.arange(more, dtype=np.int64), as_many[table.partials[as_many] != 0]))
