# Learning a grammar's stack-top verdicts before its first masks ask for them (the time a session has
# before its first token: its prompt is evaluated after it is created).
#
# Contract:
# - A mask is composed from the verdicts of its state's stack tops (masks/cache.py); a state met for the
#   first time costs a walk of the vocabulary for each top not seen before, and a short document of a new
#   schema meets a new top at nearly every step. `Lookahead` learns those verdicts ahead: it visits the
#   stacks the grammar can reach from its start, in breadth-first order of terminals matched (every stack
#   of every state a generation can reach is one of them: a state's stacks after a code point or a token
#   are its matched stacks' `Rules.pop_terminal`; the positions of a long bounded repetition that share
#   their masks, `same`, are one stack to it), and hands each one's top to `learn` once. So the first
#   tops met by every path come first, whatever the document, and a state later met composes its mask
#   from verdicts already kept.
# - Nothing here decides a token: `learn` fills the caches masks are composed from, which give the same
#   masks warm or cold. Work is bounded by the caller's seconds of this thread's CPU (`run`), resumable
#   (the next `run` goes on from where the last one stopped), and stops as soon as the caller's `pause`
#   says so, inside a top's walk too: the walk asks at each column (masks/compute.py's `Interruption`), so
#   a mask asked for meanwhile waits for one column's move, not for the whole top (on qwen2's 152k tokens
#   a top costs 0.3 ms at the median, about 2 ms at p90, and tens of milliseconds for the rare top most
#   space-led tokens pass, such as a `space` rule's `[ \t]`). A top stopped midway keeps what its walk
#   learnt whole (the shorter tops it is built on) and is learnt on at the next run.
# - Bounded memory: the stacks found (at most `max_stacks`, each no deeper than `max_depth` positions: what
#   a breadth-first budget of a fraction of a second can reach; past the bound nothing new is found, and
#   the search ends once those found are learnt) and the frontier; both are dropped when it ends.
# - One run at a time per grammar: a second caller while one runs returns at once, having done nothing.
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from constraintd.engine.grammar.elements import CHAR, CHAR_ANY, CHAR_NOT
from constraintd.engine.grammar.stacks import Rules, Stack, stack_depth
from constraintd.engine.masks.compute import Interruption
from constraintd.errors import DeadlineError

__all__ = ["LOOKAHEAD_SECONDS", "AheadRun", "Lookahead"]

_CHAR_KINDS: Final = frozenset((CHAR, CHAR_NOT, CHAR_ANY))
# CPU seconds a server spends on a new grammar's lookahead by default: about what a short document's first
# visits cost on a 150k-token vocabulary, and less than a prompt's evaluation takes on most models.
LOOKAHEAD_SECONDS: Final = 0.25
# Stacks one grammar's search finds at most, nearest the start first: more than a budget of a quarter second
# learns on a vocabulary of 150k tokens (a few hundred tops), and on a tiny vocabulary, whose tops cost
# microseconds, what keeps a grammar's lookahead within about a megabyte.
MAX_STACKS: Final = 1024
# A stack the search keeps, as `nbytes` counts it: a set entry and a tuple of a few positions.
_STACK_BYTES: Final = 160
# Deeper stacks are not followed: nesting that deep is rarely met in a first token's window.
MAX_DEPTH: Final = 64


@dataclass(frozen=True, slots=True)
class AheadRun:
    """What one `Lookahead.run` did."""

    tops: int  # verdicts learnt (the tops `learn` was handed)
    stacks: int  # stacks visited
    seconds: float  # this thread's CPU time spent
    total: float  # the grammar's lookahead CPU time over every run, this one included
    finished: bool  # the search has ended: every reachable stack within the bounds visited, or a bound met


class Lookahead:
    """The breadth-first search of one grammar's reachable stacks, learning each one's top verdict."""

    __slots__ = (
        "_frontier",
        "_seen",
        "_tops",
        "_turn",
        "learn",
        "max_depth",
        "max_stacks",
        "rules",
        "same",
        "spent",
    )

    def __init__(
        self,
        rules: Rules,
        initial: frozenset[Stack],
        learn: Callable[[Stack, float], object],
        *,
        max_stacks: int = MAX_STACKS,
        max_depth: int = MAX_DEPTH,
        same: Callable[[Stack], Stack] | None = None,
    ) -> None:
        self.rules = rules
        # the stack whose verdicts a stack shares (masks/cache.py's `same_stack`: the positions of a long
        # bounded repetition that no token tells apart made one), so that the search visits them once
        self.same = same
        # learns the verdict of one stack's top (what a mask of a state holding it needs), stopping with
        # DeadlineError once the deadline it is given passes (masks/compute.py's Interruption)
        self.learn = learn
        self.max_stacks = max_stacks
        self.max_depth = max_depth
        self.spent = 0.0  # this grammar's CPU seconds of lookahead so far, over every run
        start = list({same(stack) if same is not None else stack for stack in initial if stack})
        self._seen: set[Stack] | None = set(start)
        self._frontier: deque[Stack] = deque(start)
        self._tops = 0
        # one run at a time, without a lock (the engine takes no threading): taking the deque's one item
        # is atomic, and a second caller finds it empty
        self._turn: deque[None] = deque((None,))

    @property
    def finished(self) -> bool:
        """Whether the search has ended (nothing left to learn within its bounds)."""
        return self._seen is None

    def run(self, seconds: float, *, pause: Callable[[], bool] | None = None) -> AheadRun:
        """Learn verdicts for up to `seconds` of this thread's CPU time, stopping early when `pause()` is
        true (asked before each top and at each column of its walk) or the search ends. With no time, or
        while another thread's run is in progress, it returns at once, having done nothing (what it
        returns tells what is left).
        """
        if seconds <= 0:
            return AheadRun(0, 0, 0.0, self.spent, self.finished)
        try:
            self._turn.pop()
        except IndexError:  # another run holds the turn
            return AheadRun(0, 0, 0.0, self.spent, self.finished)
        try:
            return self._run(seconds, pause)
        finally:
            self._turn.append(None)

    def _run(self, seconds: float, pause: Callable[[], bool] | None) -> AheadRun:
        seen = self._seen
        if seen is None:
            return AheadRun(0, 0, 0.0, self.spent, True)
        started = time.thread_time()
        until = started + seconds

        def stop() -> bool:
            return time.thread_time() >= until or (pause is not None and pause())

        # the same question inside a top's walk, at each of its columns: it stops there
        interruption = Interruption(stop)
        frontier, rules, learn, same = self._frontier, self.rules, self.learn, self.same
        kinds, pop = rules.kinds, rules.pop_terminal
        tops = stacks = 0
        while frontier and not stop():
            stack = frontier[0]
            if kinds[stack[-1]] in _CHAR_KINDS:
                try:
                    learn(stack, interruption)
                except DeadlineError:
                    break  # left at the frontier's head: the next run learns it on from what was kept
                tops += 1
            frontier.popleft()
            stacks += 1
            for popped in pop(stack):
                after = same(popped) if same is not None else popped
                if len(seen) >= self.max_stacks:
                    break  # nothing new past the bound: the stacks found so far are still learnt
                if after and after not in seen and stack_depth(after) <= self.max_depth:
                    seen.add(after)
                    frontier.append(after)
        spent = time.thread_time() - started
        self.spent += spent
        self._tops += tops
        if not frontier:
            self._seen = None  # ended: what it held goes
        return AheadRun(tops, stacks, spent, self.spent, not frontier)

    @property
    def nbytes(self) -> int:
        """An estimate of what the search holds: its stacks seen (a set entry and a short tuple each)."""
        seen = self._seen
        return len(seen) * _STACK_BYTES if seen is not None else 0

    @property
    def learnt(self) -> int:
        """Tops handed to `learn` so far, over every run."""
        return self._tops
