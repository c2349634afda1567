# New grammars' first verdicts learnt in the time their sessions have before their first masks.
#
# Invariants:
# - A session is created before its prompt is evaluated: tens to hundreds of milliseconds in which nothing
#   asks its grammar for a mask. `AheadWorker` spends that time, for each grammar a CreateSession opened a
#   session on, on `Grammar.lookahead` (engine/masks/ahead.py): up to `seconds` of its own CPU per grammar
#   over the grammar's whole life, so a grammar many sessions share is searched once.
# - It never holds up work a caller waits for: it runs only while no compile and no mask job is running
#   (`busy()`, entered by the servicer around each), and stops as soon as one starts, inside a stack top's
#   walk too (at its next column: engine/masks/ahead.py), and its thread runs at a lower scheduling
#   priority, as the worker pools' do.
# - One daemon thread, a queue of at most `max_queued` grammars (a grammar queued already, or whose
#   lookahead is spent or finished, is not queued again; past the bound a grammar is left to its masks, as
#   without lookahead). Shutdown stops it at the next top.
# - `submit` runs on the event loop and calls nothing of the grammar's: what its lookahead has left is
#   read by the worker's thread (the first call makes the search, and the search's first use of a
#   vocabulary's tables can build them), and a grammar whose lookahead ended is remembered here, weakly.
# - Nothing it does changes an answer: it fills caches masks are composed from.
from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator

from constraintd.engine import Grammar
from constraintd.engine.masks.ahead import AheadRun
from constraintd.server.workers import lower_priority

__all__ = ["AheadWorker"]

log = logging.getLogger("constraintd.server")


class AheadWorker:
    """One thread learning new grammars' first verdicts while the server has nothing else to compute."""

    def __init__(
        self,
        seconds: float,
        *,
        nice: int = 10,
        max_queued: int = 64,
        on_run: Callable[[AheadRun], None] | None = None,
    ) -> None:
        if seconds <= 0:
            raise ValueError("a lookahead worker needs a positive budget a grammar")
        self.seconds = seconds
        self.nice = nice
        self.max_queued = max_queued
        self.on_run = on_run  # told of every run (the metrics count them)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: deque[Grammar] = deque()
        self._queued: set[str] = set()  # keys of the grammars in the queue
        self._ended: weakref.WeakSet[Grammar] = weakref.WeakSet()  # lookahead spent or finished
        self._busy = 0  # compiles and mask jobs running now
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="constraintd-lookahead", daemon=True)
        self._thread.start()

    def submit(self, grammar: Grammar) -> bool:
        """Queue `grammar` for its lookahead (cheap; never blocks on the work). False when it is not queued:
        queued already, its budget spent or its search finished, the queue full, or the worker shut down."""
        with self._lock:
            if (
                self._closed
                or grammar.key in self._queued
                or grammar in self._ended
                or len(self._queue) >= self.max_queued
            ):
                return False
            self._queue.append(grammar)
            self._queued.add(grammar.key)
            self._wake.notify()
            return True

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Held around work a caller waits for: the lookahead pauses until none is left."""
        with self._lock:
            self._busy += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
                if not self._busy:
                    self._wake.notify()

    def queued(self) -> int:
        """Grammars waiting for their lookahead."""
        with self._lock:
            return len(self._queue)

    def shutdown(self) -> None:
        """Stops the worker at its next stack top; queued grammars are dropped."""
        with self._lock:
            self._closed = True
            self._queue.clear()
            self._queued.clear()
            self._wake.notify()

    def _paused(self) -> bool:
        return self._busy > 0 or self._closed  # an int read, no lock: a stale answer costs one top

    def _next(self) -> Grammar | None:
        # the next grammar once nothing else runs (None: shut down)
        with self._lock:
            while not self._closed and (not self._queue or self._busy):
                self._wake.wait()
            if self._closed:
                return None
            return self._queue[0]

    def _work(self) -> None:
        lower_priority(self.nice)
        while True:
            grammar = self._next()
            if grammar is None:
                return
            try:
                run = grammar.lookahead(0.0)
                if not run.finished and run.total < self.seconds:
                    run = grammar.lookahead(self.seconds - run.total, pause=self._paused)
                    if self.on_run is not None:
                        self.on_run(run)
            except Exception:  # a bug: the grammar's masks still learn as they would have; keep serving
                log.exception("lookahead failed", extra={"grammar": grammar.key[:12]})
                run = AheadRun(0, 0, 0.0, self.seconds, True)
            with self._lock:
                # done with it when its search ended or its budget is spent; else it was paused, and goes on
                # once nothing else runs
                if (run.finished or run.total >= self.seconds) and self._queue and self._queue[0] is grammar:
                    self._queue.popleft()
                    self._queued.discard(grammar.key)
                    self._ended.add(grammar)
