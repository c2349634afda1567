# The whole-vocabulary mask: every token llama_grammar_apply_impl leaves finite, from one grammar state.
#
# Contract:
# - `compute_mask(state, partial, vocab, limit)` returns, for a grammar that is not awaiting a trigger, the
#   packed mask (masks/bitmask.py's layout) of exactly the tokens llama.cpp's apply allows from the stack set
#   `state` (None: no stacks) after a piece left `partial` unfinished: end-of-generation tokens when
#   the empty stack is among the stacks; never a NEVER token; otherwise the tokens some stack takes whole
#   (llama_grammar_reject_candidates), an unfinished last sequence judged by match_partial_char.
# - No Python loop over the vocabulary. The tokens are walked column by column (vocab/decoded.py): all
#   tokens that share a state at column j are moved on at once with numpy, through the state's code-point
#   intervals (`State.segments`); Python runs once per (state, column), plus once per interval the first
#   time a state meets it. Token-topped stacks decide the tokens they meet by id. Once at most _FEW_ROWS
#   rows are left (the long tail of a walk, or the few uncertain rows a verdict walks again), they go on
#   one at a time through the states' memoized steps: numpy's calls cost more a column than that.
# - `walk` also runs from stacks cut short by an escape mark (stacks.Rules.escape), for masks/cache.py:
#   a row that reaches the mark on some path and is not allowed on another is "uncertain" (the stacks
#   below decide it); every other verdict is the same whatever lies below. Given an `escapes` list, it
#   also records at which column each uncertain row met the mark (`escape_columns` reads it):
#   masks/cache.py then walks a longer top over only the rows whose code point there could go on below.
# - A state that moves a set of code points back to itself (a string's `char*`: every character but the
#   quote, the backslash and controls) keeps a row there until its first code point outside the set, and
#   the table knows where that is for every row and column (`ColumnTable.run_ends`, counted once per set
#   and vocabulary, by the first walk with rows enough in the loop to pay for it; RUN_END_SHARE): such
#   rows skip to that column, or, when none is left, end in that state and are judged at once. What the
#   state decides of a row (a token on top, an escape mark) it decides alike at every column the row
#   stays, so it is judged once, with every column the mark was met at. A long token inside a string (a
#   run of dashes or spaces) costs one step, not one column loop per character.
# - Fixed-length repetitions of one char class (a UUID's `[0-9a-f]{8}`, a literal's repeated character:
#   `State.class_run`) are not walked column by column when the caller hands `walk` a `ClassRuns` of the
#   table: a row's fate inside the run is decided by how many of its first code points the class
#   matches in a row (counted once per class for every row, and kept by the `ClassRuns`), so each
#   position of the run costs a few passes over its rows, and only the rows that get past the run are
#   walked on, from the state after it.
from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from typing import Final

import numpy as np
import numpy.typing as npt

from constraintd.engine.grammar.elements import TOKEN
from constraintd.engine.grammar.stack_sets import ClassRun, State
from constraintd.engine.grammar.stacks import CharClass
from constraintd.engine.grammar.utf8 import PartialUtf8
from constraintd.engine.lru import LruCache
from constraintd.engine.masks.bitmask import pack_mask
from constraintd.engine.vocab.decoded import (
    ColumnTable,
    DecodedVocab,
    PartialBounds,
    Ranges,
    decode_partial,
    partial_bounds,
)
from constraintd.errors import DeadlineError

__all__ = [
    "ClassRuns",
    "Interruption",
    "check_deadline",
    "class_members",
    "compute_allowed",
    "compute_mask",
    "escape_columns",
    "rows_past_first",
    "rows_without",
    "union_rows",
    "walk",
]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
# Where uncertain rows met an escape mark: (rows, the column at which each met it there), -1 where the
# column does not say (a row that ended in an unfinished sequence there): `walk`'s `escapes`.
Escapes = list[tuple[IntArray, IntArray]]
_DEAD: Final = 0
# Keys (state << _STATE_SHIFT | value) order rows by state, then by a code point or a partial code, both
# below 2 ** 33 (llama.cpp's decoder never yields a code point of 23 bits or more).
_STATE_SHIFT: Final = 33
_LOW_BITS: Final = (1 << _STATE_SHIFT) - 1
# A chain (`walk`'s `chained`) is followed past a column only for at least _CHAIN_ROWS rows, and its
# set's run ends are counted only where it moves at least 1/_CHAIN_SHARE of the table's rows.
_CHAIN_ROWS: Final = 1024
_CHAIN_SHARE: Final = 16
# The last code point Unicode has: a set's width (`walk`'s chains) counts none above it.
_MAX_CODE_POINT: Final = 0x10FFFF
# Rows at most that the column loop hands to a walk of one row at a time (_walk_singly).
_FEW_ROWS: Final = 32
# Rows at least that one state moves through a table over the distinct code points (a column's move).
_DENSE_ROWS: Final = 16384
# A set a state loops on has its run ends counted (`ColumnTable.run_ends`) when the rows a walk has in
# that state times the columns left are at least 1/RUN_END_SHARE of the table's code points.
RUN_END_SHARE: Final = 4
# Default bound of the run counts one `ClassRuns` keeps (two bytes a row per class).
MAX_RUN_BYTES: Final = 4 << 20


class ClassRuns:
    """Per char class, how many code points in a row, from the first, each row of one table has in that
    class: what `walk` reads to decide a fixed-length run of the class (see the module comment). Kept up
    to `max_bytes`, least recently used dropped first; owned by whoever owns the walks (a grammar's
    masks/cache.py `MaskCache`)."""

    __slots__ = ("_counts", "_lengths", "table")

    def __init__(self, table: ColumnTable, *, max_bytes: int = MAX_RUN_BYTES) -> None:
        self.table = table
        self._counts: LruCache[CharClass, npt.NDArray[np.uint16]] = LruCache(max_bytes)
        self._lengths: npt.NDArray[np.uint16] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the counts kept, and of the rows' lengths."""
        lengths = self._lengths
        return self._counts.size + (lengths.nbytes if lengths is not None else 0)

    def lengths(self) -> npt.NDArray[np.uint16]:
        """Per row of the table, its code points (at most 65,535)."""
        lengths = self._lengths
        if lengths is None:
            # rows are sorted longest first: rows [count_from[j + 1], count_from[j]) have j + 1 code points
            count_from = self.table.count_from
            bounds = np.array((0, *reversed(count_from), self.table.ids.size), dtype=np.int64)
            found = np.repeat(np.arange(len(count_from), -1, -1, dtype=np.int64), np.diff(bounds))
            lengths = self._lengths = np.minimum(found, np.iinfo(np.uint16).max).astype(np.uint16)
            lengths.flags.writeable = False
        return lengths

    def known(self, char_class: CharClass) -> bool:
        """Whether the counts of `char_class` are kept (no work to read them)."""
        return self._counts.peek(char_class) is not None

    def counts(self, char_class: CharClass) -> npt.NDArray[np.uint16]:
        """Per row of the table, its leading code points that `char_class` matches (llama.cpp's
        match_char), at most 65,535."""
        counts = self._counts.get(char_class)
        if counts is None:
            counts = self._count(char_class)
            counts.flags.writeable = False
            self._counts.put(char_class, counts, counts.nbytes)
        return counts

    def _count(self, char_class: CharClass) -> npt.NDArray[np.uint16]:
        table = self.table
        counts = np.zeros(table.ids.size, dtype=np.uint16)
        count_from = table.count_from
        indexes = table.dense_columns()[1]
        inside = class_members(char_class, table.dense_columns()[0])
        live = self.starting(char_class)  # rows with one code point in the class so far, ascending
        top = min(len(count_from), np.iinfo(np.uint16).max)
        j = 1
        while live.size:
            # each row is written once, with the column where its run stops: its end, or a code point
            # outside the class
            cut = int(np.searchsorted(live, count_from[j])) if j < top else 0
            counts[live[cut:]] = j
            live = live[:cut]
            if not live.size:
                break
            ok = inside[indexes[j][live]]
            counts[live[~ok]] = j
            live = live[ok]
            j += 1
        return counts

    def starting(self, char_class: CharClass) -> IntArray:
        """The rows (ascending) whose first code point is in `char_class`."""
        table = self.table
        return np.flatnonzero(class_members(char_class, table.first_code_points)[table.first_index])

    def count_starting(self, char_class: CharClass) -> int:
        """How many rows `starting` gives, counted from the rows' groups by first code point."""
        table = self.table
        starts = table.row_groups().group_starts
        values = table.first_code_points
        inside = 0
        covered = -1  # the highest code point counted so far: the ranges may overlap
        for low, high in sorted(char_class[1]):
            low = max(low, covered + 1)
            if low > high:
                continue
            first = int(np.searchsorted(values, low, side="left"))
            last = int(np.searchsorted(values, high, side="right"))
            inside += int(starts[last] - starts[first])
            covered = high
        return inside if char_class[0] else int(starts[-1]) - inside


def class_members(char_class: CharClass, values: IntArray) -> BoolArray:
    """Per code point of `values`, whether `char_class` matches it (llama_grammar_match_char: in one of
    the ranges, for a positive class)."""
    positive, ranges = char_class
    hit = np.zeros(values.size, dtype=np.bool_)
    for low, high in ranges:
        hit |= (low <= values) & (values <= high)
    return hit if positive else ~hit


def compute_mask(
    state: State | None,
    partial: PartialUtf8,
    vocab: DecodedVocab,
    limit: int,
    *,
    deadline: float | None = None,
) -> npt.NDArray[np.int32]:
    """The packed mask of the tokens llama.cpp allows from `state` after `partial` (read-only).

    Raises:
        LimitError: a state met inside a token has more than `limit` stacks.
        DeadlineError: the walk was still going at `deadline` (time.monotonic()): it stops there.
    """
    mask = pack_mask(compute_allowed(state, partial, vocab, limit, deadline=deadline))
    mask.flags.writeable = False
    return mask


def compute_allowed(
    state: State | None,
    partial: PartialUtf8,
    vocab: DecodedVocab,
    limit: int,
    *,
    deadline: float | None = None,
) -> BoolArray:
    """One bool per token: what `compute_mask` packs."""
    allowed = np.zeros(vocab.n_tokens, dtype=np.bool_)
    if state is None:
        return allowed
    if state.has_empty:
        allowed[vocab.eog_tokens] = True
    if partial[1] <= 0:
        table = vocab.fresh_table()
        rows, _ = walk(table, table.columns, state, limit, deadline=deadline)
        allowed[table.ids[rows]] = True
        return allowed
    value, n_remain = partial
    after = vocab.partial_table(n_remain)
    # pieces too short to finish the sequence: only their unfinished end is judged
    if after.short_ids.size:
        values = (value << (6 * after.short_lengths)) | after.short_bits
        codes = (values << 2) | (n_remain - after.short_lengths)
        allowed[after.short_ids[_partials_ok(state, codes)]] = True
    # the others finish it with their first bytes: column 0 is the finished code point
    table = after.long
    if table.ids.size:
        first = (value << (6 * n_remain)) | after.long_bits
        rows, _ = walk(table, (first, *table.columns[1:]), state, limit, deadline=deadline)
        allowed[table.ids[rows]] = True
    return allowed


def walk(
    table: ColumnTable,
    columns: tuple[IntArray, ...],
    start: State,
    limit: int,
    *,
    rows: IntArray | None = None,
    column: int = 0,
    runs: ClassRuns | None = None,
    deadline: float | None = None,
    escapes: Escapes | None = None,
) -> tuple[IntArray, IntArray]:
    """Walk `rows` of `table` (all by default; ascending) from `start`, a column at a time, until
    `deadline` (time.monotonic(); None: no time limit).

    `columns` are the table's, possibly with column 0 replaced (a finished partial sequence). With
    `column` above 0, the rows (given, each with a code point there) are in `start` at that column.
    `runs`, the table's run counts, decides a fixed-length repetition of one char class at `start`
    without walking it (see the module comment). `escapes`, when given, gets where rows met an escape
    mark (see `Escapes`; read with `escape_columns`).

    Returns:
        The rows allowed, and the rows not allowed that reached an escape mark (ascending).

    Raises:
        LimitError: a state met has more than `limit` stacks.
        DeadlineError: past `deadline`, checked at every column and every state's first move.
    """
    if rows is not None and rows.size <= _FEW_ROWS:
        return _walk_few(table, columns, start, rows, column, limit, deadline, escapes)
    if (
        runs is not None
        and rows is not None
        and column == 0
        and runs.table is table
        and columns[0] is table.columns[0]
    ):
        run = start.class_run(limit, len(columns) + 1)
        # Counting a class costs about a walk of the rows that start in it, once: worth it when the run's
        # positions would each walk these rows (a run of d positions, d walks), not for a short run met
        # with a few rows
        if (
            run is not None
            and run[1] > 1
            and (runs.known(run[0]) or rows.size * run[1] >= runs.count_starting(run[0]))
        ):
            return _walk_run(table, columns, start, run, rows, runs, limit, deadline, escapes)
    # the rows allowed and the rows uncertain, as arrays of rows gathered along the walk: most walks keep
    # few (a literal, a narrow class), and two vocabulary-sized rows of bools to list them at the end
    # would cost more than the rest of such a walk
    allowed: list[IntArray] = []
    uncertain: list[IntArray] = []
    states: list[State | None] = [None, start]
    local: dict[State | None, int] = {None: _DEAD, start: 1}
    next_ids: dict[int, IntArray] = {}
    lookups: dict[int, IntArray] = {}  # per local state: its move by distinct code point (dense_columns)

    def local_id(state: State | None) -> int:
        found = local.get(state)
        if found is None:
            found = local[state] = len(states)
            states.append(state)
        return found

    def segment_map(index: int) -> tuple[IntArray, IntArray]:
        state = states[index]
        assert state is not None
        bounds, after = state.segments(limit)
        ids = next_ids.get(index)
        if ids is None:
            check_deadline(deadline)
            ids = next_ids[index] = np.array([local_id(s) for s in after], dtype=np.int64)
        return bounds, ids

    count_from = table.count_from
    # every row of the table, with its own column 0: that column moves once per distinct code point
    whole = rows is None and bool(columns) and columns[0] is table.columns[0]
    # rows carried through a loop to a later column, by that column (`carry`)
    later: dict[int, list[tuple[IntArray, IntArray]]] = {}
    # the columns from which on `columns` are the table's own, whose run ends `carry` reads
    own_from = len(columns)
    if columns is table.columns:
        own_from = 0
    elif len(columns) == len(table.columns) and all(
        mine is theirs for mine, theirs in zip(columns[1:], table.columns[1:], strict=True)
    ):
        own_from = 0 if not columns or columns[0] is table.columns[0] else 1
    # for `carry`, made at its first call: rows with a code point at each column (0 past the last), and
    # the table's code points
    sizes: tuple[IntArray, int] | None = None
    loop_ranges: dict[int, Ranges | None] = {}

    def looped(index: int) -> Ranges | None:
        # the code points a local state moves back to itself, as ranges (None: there are none)
        if index in loop_ranges:
            return loop_ranges[index]
        state = states[index]
        found = None
        if state is not None:
            bounds, after = state.segments(limit)
            lows = [0, *bounds.tolist()]
            highs = [high - 1 for high in bounds.tolist()] + [_LOW_BITS]
            ranges: list[tuple[int, int]] = []
            for low, high, target in zip(lows, highs, after, strict=True):
                if target is state and low <= high:
                    if ranges and ranges[-1][1] + 1 == low:
                        ranges[-1] = (ranges[-1][0], high)
                    else:
                        ranges.append((low, high))
            found = tuple(ranges) or None
        loop_ranges[index] = found
        return found

    # per local state heading a chain (`chained`): the set's ranges, and the chain's states so far
    chains: dict[int, tuple[Ranges, list[int]] | None] = {}

    def chained(index: int) -> tuple[Ranges, list[int]] | None:
        # A state that decides nothing itself (no token on top, no escape mark) and moves one set of code
        # points C, the widest it moves anywhere but to itself or to no stack, to one state S1 (the copies
        # of a minimum repetition, `char{22,4096}`; a bounded repetition's chain of links): C's ranges and
        # the chain [this state, S1] that `extend` lengthens while each next state moves all of C on to
        # one state again. None for any other state.
        if index in chains:
            return chains[index]
        state = states[index]
        found = None
        if state is not None and not state.token_tops and not state.has_escape:
            bounds, ids = segment_map(index)
            lows = [0, *bounds.tolist()]
            highs = [high - 1 for high in bounds.tolist()] + [_LOW_BITS]
            targets = ids.tolist()
            widths: dict[int, int] = {}
            for low, high, target in zip(lows, highs, targets, strict=True):
                if target not in (_DEAD, index) and low <= high:
                    widths[target] = widths.get(target, 0) + min(high, _MAX_CODE_POINT) - low + 1
            if widths:
                widest = max(widths, key=lambda target: widths[target])
                ranges: list[tuple[int, int]] = []
                for low, high, target in zip(lows, highs, targets, strict=True):
                    if target == widest and low <= high:
                        if ranges and ranges[-1][1] + 1 == low:
                            ranges[-1] = (ranges[-1][0], high)
                        else:
                            ranges.append((low, high))
                found = (tuple(ranges), [index, widest])
        chains[index] = found
        return found

    def extend(ranges: Ranges, chain: list[int], depth: int) -> None:
        # lengthens `chain` up to `depth` moves: while its last state decides nothing itself and moves
        # every code point of `ranges` to one state with stacks (a state met again is fine: a cycle)
        while len(chain) <= depth:
            state = states[chain[-1]]
            if state is None or state.token_tops or state.has_escape:
                return
            bounds, ids = segment_map(chain[-1])
            edges, targets = bounds.tolist(), ids.tolist()
            target = -1
            for low, high in ranges:
                # the intervals holding low to high: targets[first], ..., targets[last]
                first, last = bisect.bisect_right(edges, low), bisect.bisect_right(edges, high)
                if target < 0:
                    target = targets[first]
                if any(other != target for other in targets[first : last + 1]):
                    return
            if target == _DEAD:
                return
            chain.append(target)

    def carry(j: int, rows: IntArray, at: IntArray, loops: list[int]) -> tuple[IntArray, IntArray]:
        # Rows at column j in a state that moves a set of code points back to itself stay there for as
        # long as their code points are in the set: each goes on from the first column where one is not
        # (kept in `later` until the column loop gets there), or ends in that state and is judged at once.
        # What the state decides where a row is (a token on top, an escape mark) it decides alike at every
        # column the row stays there: judged now, with every column an escape mark was met at. Returns the
        # rows left at j.
        nonlocal sizes
        if sizes is None:
            sizes = np.array((*count_from, 0), dtype=np.int64), table.code_points
        ends_at, code_points = sizes
        moved = np.zeros(rows.size, dtype=np.bool_)
        for index in loops:
            ranges = looped(index)
            if ranges is None:
                moved |= follow_chain(j, rows, at, index, ends_at)
                continue
            here = np.flatnonzero(at == index)
            # counting a set's run ends reads every code point of the table once: worth it where these
            # rows could take a good share of that many steps, and kept for every later walk
            build = here.size * (len(columns) - j) * RUN_END_SHARE >= code_points
            ends = table.run_ends(ranges, build=build)
            if ends is None:
                continue
            stop = ends[j][rows[here]].astype(np.int64)
            going = stop > j
            if not going.any():
                continue
            here, stop = here[going], stop[going]
            moved[here] = True
            gone = rows[here]
            state = states[index]
            assert state is not None
            if state.token_tops:
                _judge_token_tops(table, state, gone, allowed)
            if state.has_escape and escapes is not None:
                # met at each column from j to where the row goes on or ends (that column's record, and
                # the row's place among the uncertain, are made there)
                stays = stop - j
                first_of_row = np.repeat(np.cumsum(stays) - stays, stays)
                met_at = j + np.arange(int(stays.sum()), dtype=np.int64) - first_of_row
                escapes.append((np.repeat(gone, stays), met_at))
            ended = gone >= ends_at[stop]
            if ended.any():
                _judge_ends(table, gone[ended], np.full(int(ended.sum()), index, dtype=np.int64), states,
                            allowed, uncertain, escapes)
                gone, stop = gone[~ended], stop[~ended]
                if not gone.size:
                    continue
            order = np.argsort(stop, kind="stable")  # rows stay ascending within a column
            gone, stop = gone[order], stop[order]
            cuts = np.flatnonzero(stop[1:] != stop[:-1]) + 1
            for part, column in zip(np.split(gone, cuts), stop[np.r_[0, cuts]].tolist(), strict=True):
                later.setdefault(column, []).append((part, np.full(part.size, index, dtype=np.int64)))
        return rows[~moved], at[~moved]

    def follow_chain(j: int, rows: IntArray, at: IntArray, index: int, ends_at: IntArray) -> BoolArray:
        # `carry` of the rows at column j in a state heading a chain (`chained`): a row whose code points
        # from j to s - 1 are in the chain's set C (its run end from j: s) goes from the chain's state 0
        # to its state s - j at column s, without a column loop, and ends there (judged at once) or goes
        # on from there. No state it passes on the way decides anything but the move, so nothing else is
        # decided for it. A row past the chain's last state (or past the depth _CHAIN_ROWS rows reach)
        # goes on from that state, at its column. Returns the rows moved.
        moved = np.zeros(rows.size, dtype=np.bool_)
        found = chained(index)
        assert found is not None
        ranges, chain = found
        here = np.flatnonzero(at == index)
        if here.size < _CHAIN_ROWS:
            return moved
        extend(ranges, chain, 2)
        if len(chain) < 3:  # one move: no column saved (a chain that meets an escape mark at once)
            return moved
        ends = table.run_ends(ranges, build=False)
        if ends is None:
            # counting a set's run ends reads every code point of the table once: only for a set that
            # moves a good share of the table here (a string's characters, not a literal's one)
            moving = class_members((True, ranges), columns[j][rows[here]])
            if int(np.count_nonzero(moving)) * _CHAIN_SHARE < table.ids.size:
                return moved
            ends = table.run_ends(ranges)
            assert ends is not None
        steps = ends[j][rows[here]].astype(np.int64)
        steps -= j
        # rows per number of steps; the depth the chain is followed to: at least _CHAIN_ROWS rows get that
        # far (past it, fewer rows go on from there column by column: each state of the chain costs about
        # one column of them)
        reaching = np.cumsum(np.bincount(steps)[::-1])[::-1]  # rows taking at least d steps, per d
        depth = int(np.searchsorted(-reaching, -_CHAIN_ROWS, side="right")) - 1
        if depth < 1:
            return moved
        going = steps > 0
        here, steps = here[going], steps[going]
        extend(ranges, chain, depth)
        depth = min(depth, len(chain) - 1)
        moved[here] = True
        gone = rows[here]
        np.minimum(steps, depth, out=steps)
        at_state = np.array(chain, dtype=np.int64)[steps]
        stop = steps
        stop += j
        ended = gone >= ends_at[stop]
        if ended.any():
            _judge_ends(table, gone[ended], at_state[ended], states, allowed, uncertain, escapes)
            keep = ~ended
            gone, stop, at_state = gone[keep], stop[keep], at_state[keep]
        if gone.size:
            order = np.argsort(stop, kind="stable")  # rows stay ascending within a column
            gone, stop, at_state = gone[order], stop[order], at_state[order]
            cuts = np.flatnonzero(stop[1:] != stop[:-1]) + 1
            starts = np.r_[0, cuts]
            for part, states_at, column in zip(
                np.split(gone, cuts), np.split(at_state, cuts), stop[starts].tolist(), strict=True
            ):
                later.setdefault(column, []).append((part, states_at))
        return moved

    first = 0
    if whole and not start.token_tops and not start.has_escape:
        # nothing to decide at column 0 but the move: only the rows it keeps alive are ever listed
        _judge_bare(table, start, allowed)
        rows, at = _first_column(table, *segment_map(1))
        split = int(np.searchsorted(rows, count_from[1] if len(count_from) > 1 else 0))
        if split < rows.size:
            _judge_ends(table, rows[split:], at[split:], states, allowed, uncertain, escapes)
            rows, at = rows[:split], at[:split]
        first = 1
    else:
        if rows is None:
            rows = np.arange(table.ids.size, dtype=np.int64)
        # rows without a code point at `column` only end in an unfinished sequence
        split = int(np.searchsorted(rows, count_from[column] if column < len(count_from) else 0))
        _judge_ends(
            table,
            rows[split:],
            np.ones(rows.size - split, dtype=np.int64),
            states,
            allowed,
            uncertain,
            escapes,
        )
        rows = rows[:split]
        at = np.ones(rows.size, dtype=np.int64)
        first = column
    for j in range(first, len(columns)):
        check_deadline(deadline)
        waiting = later.pop(j, None)
        if waiting:
            rows = np.concatenate([rows, *(part for part, _ in waiting)])
            at = np.concatenate([at, *(states_at for _, states_at in waiting)])
            order = np.argsort(rows, kind="stable")
            rows, at = rows[order], at[order]
        present: IntArray | None = None
        if j >= own_from and rows.size > _FEW_ROWS and not (j == 0 and whole):
            present = np.flatnonzero(np.bincount(at, minlength=len(states)))
            many = rows.size >= _CHAIN_ROWS
            loops = [
                index
                for index in present.tolist()
                if looped(index) is not None or (many and chained(index) is not None)
            ]
            if loops:
                rows, at = carry(j, rows, at, loops)
                present = None
        if rows.size <= _FEW_ROWS and not (j == 0 and whole):
            if rows.size:
                starts: list[State] = []
                for index in at.tolist():
                    state = states[index]
                    assert state is not None  # dead rows were dropped
                    starts.append(state)
                rows_allowed, rows_unsure = _walk_singly(
                    table, columns, j, rows.tolist(), starts, limit, deadline, escapes
                )
                allowed.append(np.array(rows_allowed, dtype=np.int64))
                uncertain.append(np.array(rows_unsure, dtype=np.int64))
            if not later:
                break
            rows, at = rows[:0], at[:0]
            continue
        code_points = columns[j]
        if present is None:
            present = np.flatnonzero(np.bincount(at, minlength=len(states)))
        for index in present.tolist():
            state = states[index]
            if state is not None and state.token_tops:
                _judge_token_tops(table, state, rows[at == index], allowed)
            if state is not None and state.has_escape:
                met = rows[at == index]
                uncertain.append(met)
                if escapes is not None:
                    escapes.append((met, np.full(met.size, j, dtype=np.int64)))
        if j == 0 and whole:
            bounds, ids = segment_map(1)
            rows, at = _first_column(table, bounds, ids)
        elif present.size == 1:
            index = int(present[0])
            bounds, ids = segment_map(index)
            if rows.size >= _DENSE_ROWS and code_points is table.columns[j]:
                # many rows: the state's move as a table over the vocabulary's distinct code points, read
                # by each row's index into them (a gather instead of a binary search per row)
                lookup = lookups.get(index)
                if lookup is None:
                    distinct = table.dense_columns()[0]
                    lookup = lookups[index] = ids[np.searchsorted(bounds, distinct, side="right")]
                at = lookup[table.dense_columns()[1][j][rows]]
            else:
                at = ids[np.searchsorted(bounds, code_points[rows], side="right")]
        else:
            # every present state's intervals in one sorted array, each state's shifted to its own range
            # of keys (state << _STATE_SHIFT | code point): one search moves every row
            keys: list[IntArray] = []
            targets: list[IntArray] = [np.zeros(1, dtype=np.int64)]
            for index in present.tolist():
                bounds, ids = segment_map(index)
                base = index << _STATE_SHIFT
                keys.append(np.array([base], dtype=np.int64))
                keys.append(bounds + base)
                targets.append(ids)
            found = np.searchsorted(
                np.concatenate(keys), (at << _STATE_SHIFT) | code_points[rows], side="right"
            )
            at = np.concatenate(targets)[found]
        alive = at != _DEAD
        rows, at = rows[alive], at[alive]
        # rows are in table order, so the ones whose code points end here are a suffix
        split = int(np.searchsorted(rows, count_from[j + 1] if j + 1 < len(count_from) else 0))
        if split < rows.size:
            _judge_ends(table, rows[split:], at[split:], states, allowed, uncertain, escapes)
            rows, at = rows[:split], at[:split]
    n_rows = table.ids.size
    found = union_rows(allowed, n_rows)
    return found, rows_without(union_rows(uncertain, n_rows), found, n_rows)


def union_rows(arrays: list[IntArray], size: int) -> IntArray:
    """The distinct values of `arrays` (each in [0, size)), ascending."""
    # Not np.unique / np.union1d: their hashing costs milliseconds on the hundred thousand rows a permissive
    # top leaves uncertain, where a row of bools costs a tenth of one; a sort, for the few.
    if not arrays:
        return np.zeros(0, dtype=np.int64)
    total = sum(array.size for array in arrays)
    if total * 16 >= size:
        bits = np.zeros(size, dtype=np.bool_)
        for array in arrays:
            bits[array] = True
        return np.flatnonzero(bits)
    joined = np.sort(np.concatenate(arrays))
    if joined.size < 2:
        return joined
    keep = np.empty(joined.size, dtype=np.bool_)
    keep[0] = True
    np.not_equal(joined[1:], joined[:-1], out=keep[1:])
    return joined[keep]


def rows_without(values: IntArray, dropped: IntArray, size: int) -> IntArray:
    """`values` (in [0, size)) but those in `dropped`, order kept."""
    # np.isin sorts both, each time
    if not values.size or not dropped.size:
        return values
    bits = np.zeros(size, dtype=np.bool_)
    bits[dropped] = True
    return values[~bits[values]]


def escape_columns(escapes: Escapes) -> tuple[IntArray, IntArray]:
    """The distinct (row, column) pairs `escapes` (a `walk`'s) records, ordered by row, then column: every
    column at which each row met an escape mark, -1 where one does not say."""
    if not escapes:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    met = np.concatenate([pair[0] for pair in escapes])
    columns = np.concatenate([pair[1] for pair in escapes])
    order = np.lexsort((columns, met))
    met, columns = met[order], columns[order]
    distinct = np.ones(met.size, dtype=np.bool_)
    distinct[1:] = (met[1:] != met[:-1]) | (columns[1:] != columns[:-1])
    return met[distinct], columns[distinct]


def check_deadline(deadline: float | None) -> None:
    """Raises DeadlineError once time.monotonic() is past `deadline` (None: no time limit), or once an
    `Interruption` given as the deadline says stop."""
    if deadline is not None and time.monotonic() > deadline:
        raise DeadlineError("the mask ran past its time limit: its walk stopped there")


class Interruption(float):
    """A deadline that also passes as soon as `stop()` is true: given where a deadline goes (`walk`, a
    cache's `mask` or `learn`), it stops the work at its next check of the clock, with DeadlineError, as
    its time limit would. Its value is that time limit (time.monotonic(); infinity for none).

    A float, compared by `check_deadline` as `time.monotonic() > deadline`: Python asks the subclass's
    reflected `__lt__` first, which asks `stop()`.
    """

    __slots__ = ("stop",)

    stop: Callable[[], bool]

    def __new__(cls, stop: Callable[[], bool], at: float = math.inf) -> Interruption:
        self = super().__new__(cls, at)
        self.stop = stop
        return self

    def __lt__(self, now: float) -> bool:
        return self.stop() or float(self) < now


def _walk_singly(
    table: ColumnTable,
    columns: tuple[IntArray, ...],
    j: int,
    rows: list[int],
    starts: list[State],
    limit: int,
    deadline: float | None,
    escapes: Escapes | None = None,
) -> tuple[list[int], list[int]]:
    # The few rows still alive at column j (each with a code point there, in the state `starts` gives),
    # walked one at a time from here to their end: the column loop's numpy calls cost tens of
    # microseconds a column whatever the rows, a step of one row a dict lookup (State.step, memoized),
    # and a state met for the first time builds the one transition its row takes instead of all its
    # intervals'. The same verdicts: token tops and escape marks met with code points left, then the end
    # judged as _judge_ends does. Returns the rows allowed and the rows that met an escape mark (and adds
    # to `escapes` where each met it).
    count_from = table.count_from
    ids, partials = table.ids, table.partials
    n_columns = len(columns)
    allowed: list[int] = []
    uncertain: list[int] = []
    met_rows: list[int] = []  # where rows met an escape mark (`Escapes`)
    met_columns: list[int] = []
    for row, state in zip(rows, starts, strict=True):
        check_deadline(deadline)
        token = int(ids[row])
        ok = unsure = False
        k = j
        while True:
            if state.token_tops and not ok:
                ok = state.token_matches(token)
            if state.has_escape:
                unsure = True
                met_rows.append(row)
                met_columns.append(k)
            after = state.step(int(columns[k][row]), limit)
            if after is None:
                break
            state = after
            k += 1
            if k < n_columns and row < count_from[k]:
                continue
            code = int(partials[row])
            if code == 0 or state.partial_ok(decode_partial(code)):
                ok = True
            if code and state.has_escape:
                unsure = True
                met_rows.append(row)
                met_columns.append(-1)
            break
        if ok:
            allowed.append(row)
        if unsure:
            uncertain.append(row)
    if escapes is not None and met_rows:
        escapes.append((np.array(met_rows, dtype=np.int64), np.array(met_columns, dtype=np.int64)))
    return allowed, uncertain


def _walk_few(
    table: ColumnTable,
    columns: tuple[IntArray, ...],
    start: State,
    rows: IntArray,
    column: int,
    limit: int,
    deadline: float | None,
    escapes: Escapes | None = None,
) -> tuple[IntArray, IntArray]:
    # `walk` of a few rows: one at a time from the start (at `column`), without the vocabulary-sized arrays
    count_from = table.count_from
    with_code_points = count_from[column] if column < len(count_from) else 0
    listed = rows.tolist()
    walking = [row for row in listed if row < with_code_points]
    allowed, uncertain = _walk_singly(
        table, columns, column, walking, [start] * len(walking), limit, deadline, escapes
    )
    for row in listed[len(walking) :]:  # no code point: only an unfinished sequence, judged at the start
        if start.partial_ok(decode_partial(int(table.partials[row]))):
            allowed.append(row)
        if start.has_escape:
            uncertain.append(row)
            if escapes is not None:
                escapes.append((np.array([row], dtype=np.int64), np.array([-1], dtype=np.int64)))
    found = set(allowed)
    return (
        np.array(sorted(found), dtype=np.int64),
        np.array(sorted(set(uncertain) - found), dtype=np.int64),
    )


def _walk_run(
    table: ColumnTable,
    columns: tuple[IntArray, ...],
    start: State,
    run: ClassRun,
    rows: IntArray,
    runs: ClassRuns,
    limit: int,
    deadline: float | None,
    escapes: Escapes | None = None,
) -> tuple[IntArray, IntArray]:
    # `walk` of `rows` from `start`, the first of `length` states that each take only the class C (and
    # lead to the next by any code point of C), `end` the state after them. A row of n code points whose
    # first m are in C (m <= n, from `runs`):
    # - m < n and m < length: its code point m finds no stack: rejected;
    # - m == n < length: it ends inside the run, allowed if whole, or if C could still take its unfinished
    #   sequence (every state of the run has only C on top, as `start`);
    # - m == n == length: it ends in `end`, judged there as _judge_ends does;
    # - m >= length < n: it leaves the run with code points left, walked on from `end` at column `length`.
    # No state of the run has a token-topped stack or an escape mark, so nothing else is decided inside.
    char_class, length, end = run
    check_deadline(deadline)
    matched = runs.counts(char_class)[rows]
    lengths = runs.lengths()[rows]
    ended = matched == lengths  # every code point in the class, inside the run or up to its end
    decided = ended & (lengths <= length) if end is not None else ended & (lengths < length)
    allowed = decided.copy()  # whole rows that end there are allowed; unfinished ones are judged
    unsure: list[IntArray] = []
    partials = table.partials[rows]
    unfinished = np.flatnonzero(decided & (partials != 0))
    if unfinished.size:
        inside = unfinished[lengths[unfinished] < length]
        allowed[inside] = _partials_ok(start, partials[inside])
        at_end = unfinished[lengths[unfinished] == length]
        if at_end.size:
            assert end is not None
            ok = _partials_ok(end, partials[at_end])
            allowed[at_end] = ok
            if end.has_escape:
                unsure.append(rows[at_end[~ok]])
                if escapes is not None:
                    escapes.append((unsure[-1], np.full(unsure[-1].size, -1, dtype=np.int64)))
    going = rows[(matched >= length) & (lengths > length)]
    if going.size and end is not None:
        walked, uncertain = walk(
            table, columns, end, limit, rows=going, column=length, deadline=deadline, escapes=escapes
        )
        allowed[np.searchsorted(rows, walked)] = True
        unsure.append(uncertain)
    # the rows are decided in disjoint sets: the uncertain ones of each are not allowed in any other
    uncertain_rows = np.sort(np.concatenate(unsure)) if unsure else np.zeros(0, dtype=np.int64)
    return rows[allowed], uncertain_rows


def _first_column(table: ColumnTable, bounds: IntArray, ids: IntArray) -> tuple[IntArray, IntArray]:
    # Every row with a code point, moved by column 0 from the start state, whose intervals are `bounds`
    # and lead to `ids`. The table's rows grouped by first code point make each interval's rows one
    # slice, so when few stay alive (a literal, a digit) only they are touched, not the vocabulary.
    aux = table.row_groups()
    values = table.first_code_points
    # interval i holds the distinct first code points of index edges[i] to edges[i + 1]
    edges = np.zeros(bounds.size + 2, dtype=np.int64)
    edges[1:-1] = np.searchsorted(values, bounds, side="left")
    edges[-1] = values.size
    live = np.flatnonzero(ids != _DEAD)
    starts = aux.group_starts[edges[live]]
    sizes = aux.group_starts[edges[live + 1]] - starts
    total = int(sizes.sum())
    if total * 8 >= table.first_index.size:
        at = np.repeat(ids, np.diff(edges))[table.first_index]
        rows = np.flatnonzero(at != _DEAD)
        return rows, at[rows]
    before = np.cumsum(sizes) - sizes  # rows of the live intervals ahead of each
    rows = aux.by_value[np.arange(total, dtype=np.int64) + np.repeat(starts - before, sizes)]
    at = np.repeat(ids[live], sizes)
    order = np.argsort(rows)
    return rows[order], at[order]


def rows_past_first(table: ColumnTable, start: State, limit: int) -> int:
    """How many rows of `table` a whole walk from `start` moves past their first code point (a narrow
    class on top keeps few): counted from the rows' groups by first code point, without listing them.

    Raises:
        LimitError: a state one code point from `start` has more than `limit` stacks.
    """
    bounds, after = start.segments(limit)
    edges = np.zeros(bounds.size + 2, dtype=np.int64)
    edges[1:-1] = np.searchsorted(table.first_code_points, bounds, side="left")
    edges[-1] = table.first_code_points.size
    live = np.array([index for index, state in enumerate(after) if state is not None], dtype=np.int64)
    starts = table.row_groups().group_starts
    return int((starts[edges[live + 1]] - starts[edges[live]]).sum())


def _judge_bare(table: ColumnTable, start: State, allowed: list[IntArray]) -> None:
    # the rows without a single code point, from a start state without escape marks: only their
    # unfinished sequence is judged, once per distinct sequence
    aux = table.row_groups()
    if aux.bare_rows.size:
        ok = (aux.bare_codes == 0) | _bounds_ok(start, aux.bare_bounds)
        allowed.append(aux.bare_rows[ok[aux.bare_inverse]])


def _judge_token_tops(table: ColumnTable, state: State, rows: IntArray, allowed: list[IntArray]) -> None:
    # rows reaching a token-topped stack with code points left: decided by token id alone
    ids = table.ids[rows]
    for kind, value, _ in state.token_tops:
        if kind == TOKEN:
            allowed.append(rows[ids == value])
        else:
            allowed.append(rows[ids != value])


def _judge_ends(
    table: ColumnTable,
    rows: IntArray,
    at: IntArray,
    states: list[State | None],
    allowed: list[IntArray],
    uncertain: list[IntArray],
    escapes: Escapes | None = None,
) -> None:
    # rows whose code points all matched: allowed unless they end in an unfinished sequence that no char
    # class on top could still match (uncertain if the stacks below an escape mark still might)
    if rows.size == 0:
        return
    partials = table.partials[rows]
    whole = partials == 0
    allowed.append(rows[whole])
    if whole.all():
        return
    rows, at, partials = rows[~whole], at[~whole], partials[~whole]
    for index in np.flatnonzero(np.bincount(at, minlength=len(states))).tolist():  # not np.unique: slow
        state = states[index]
        if state is None:
            continue
        here = at == index
        allowed.append(rows[here][_partials_ok(state, partials[here])])
        if state.has_escape:
            uncertain.append(rows[here])
            if escapes is not None:
                escapes.append((uncertain[-1], np.full(uncertain[-1].size, -1, dtype=np.int64)))


def _partials_ok(state: State, codes: IntArray) -> BoolArray:
    # State.partial_ok over many encoded partial sequences at once
    return _bounds_ok(state, partial_bounds(codes))


def _bounds_ok(state: State, bounds: PartialBounds) -> BoolArray:
    # llama_grammar_match_partial_char on each char class on top, a sequence surviving when one of them
    # could still match it
    low, high = bounds.low, bounds.high
    ok = np.zeros(low.size, dtype=np.bool_)
    rules = state.table.rules
    for pos in state.char_tops:
        positive, ranges = rules.char_class(pos)
        hit = np.zeros(low.size, dtype=np.bool_)
        for range_low, range_high in ranges:
            hit |= (range_low <= high) & (low <= range_high)
        ok |= hit if positive else ~hit
    ok &= ~bounds.overlong
    return ok
