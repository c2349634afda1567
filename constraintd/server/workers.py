# Slow work (compiles, vocabulary loads) off the event loop, in a few worker threads, with a time limit.
#
# Invariants:
# - The event loop never runs a compile: `run` hands it to a worker thread and awaits it, so Accept and
#   Mask of other sessions keep being answered (they share the GIL with the worker, not a queue).
# - A caller waits at most `time_limit` seconds from submission (queueing included), then gets
#   DeadlineError. A thread cannot be interrupted, so the work itself runs on to its end; its result is
#   not lost (the registry caches it), and the next caller asking for the same thing finds it.
# - Workers are daemon threads: a compile that never ends cannot keep the process from exiting.
#   (concurrent.futures' pool joins its threads at exit, which is why it is not used here.)
from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from constraintd.errors import DeadlineError, UnavailableError

__all__ = ["WorkerPool"]

T = TypeVar("T")

_Job = tuple[Callable[[], Any], "Future[Any]"]


class WorkerPool:
    """A fixed number of daemon threads taking jobs in submission order."""

    def __init__(self, workers: int, *, time_limit: float, name: str = "constraintd-worker") -> None:
        if workers < 1:
            raise ValueError("a worker pool needs at least one thread")
        self.time_limit = time_limit
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    async def run(self, work: Callable[[], T], *, what: str = "work") -> T:
        """Runs `work()` in a worker thread and returns its result, or raises what it raised.

        Raises:
            DeadlineError: the result did not come within the time limit (the work runs on regardless).
            UnavailableError: the pool is shut down.
        """
        if self._closed:
            raise UnavailableError("the server is shutting down")
        future: Future[T] = Future()
        self._jobs.put((work, future))
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), self.time_limit)
        except TimeoutError:
            raise DeadlineError(f"{what} ran past its time limit of {self.time_limit:g} s") from None

    def shutdown(self) -> None:
        """Takes no more jobs; idle workers end, busy ones end after their job (they never block exit)."""
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)

    @staticmethod
    def _run_one(job: _Job) -> None:
        work, future = job
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = work()
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(result)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._run_one(job)
