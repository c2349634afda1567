# Slow work (compiles, vocabulary loads) off the event loop, in a few worker threads, with a time limit.
#
# Invariants:
# - The event loop never runs a compile: `run` hands it to a worker thread and awaits it, so Accept and
#   Mask of other sessions keep being answered (they share the GIL with the worker, not a queue).
# - A caller waits at most `time_limit` seconds from submission (queueing included), then gets
#   DeadlineError, and a job not started by then never starts. A thread cannot be interrupted: work that
#   should stop at the time limit watches the clock itself (masks, Allows checks and replays do); other
#   work runs on to its end, its result not lost (the registry caches a compile, and the next caller
#   asking for the same thing finds it).
# - Workers are daemon threads: a compile that never ends cannot keep the process from exiting.
#   (concurrent.futures' pool joins its threads at exit, which is why it is not used here.)
# - On Linux each worker thread lowers its own scheduling priority (`nice`, 10 by default): when the CPUs
#   are busy, the kernel runs the event loop's thread (and grpc's) first, so work that shares the GIL and
#   the cores with them delays their answers less. Measured with the service benchmark, this and a short
#   GIL switch interval (ServerConfig.switch_interval) keep Accept's median while a large schema compiles
#   at its median with nothing compiling, and cut its p99 about fourfold; what remains is a thread holding
#   the GIL while off the CPU. So the heavy half of a compile (conversion, parse, flattened rules) runs in
#   a worker process (processes.py, service/registry.py): a compile thread mostly waits for it, without
#   the GIL.
#   Elsewhere than Linux a thread's priority cannot be set alone, and `nice` is ignored.
from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from constraintd.errors import DeadlineError, UnavailableError

__all__ = ["WorkerPool", "lower_priority"]

T = TypeVar("T")

_Job = tuple[Callable[[], Any], "Future[Any]"]


class WorkerPool:
    """A fixed number of daemon threads taking jobs in submission order."""

    def __init__(
        self, workers: int, *, time_limit: float, name: str = "constraintd-worker", nice: int = 10
    ) -> None:
        if workers < 1:
            raise ValueError("a worker pool needs at least one thread")
        self.time_limit = time_limit
        self.nice = nice
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
        outcome = asyncio.wrap_future(future)
        try:
            return await asyncio.wait_for(asyncio.shield(outcome), self.time_limit)
        except TimeoutError:
            future.cancel()  # a job still queued never starts; one running stops only if it watches the time
            outcome.add_done_callback(_forget)  # no one waits for it now: not an error to report
            raise DeadlineError(f"{what} ran past its time limit of {self.time_limit:g} s") from None
        except BaseException as error:
            # The futures hold the error, and its traceback holds the frames it came through (this one,
            # asyncio's, the worker's): cycles that would keep those frames' locals, the job's request
            # among them, until the garbage collector runs. So the futures go, and the finished frames
            # lose their locals (the traceback keeps its files and lines).
            del future, outcome
            traceback.clear_frames(error.__traceback__)
            raise

    def shutdown(self) -> None:
        """Takes no more jobs; idle workers end, busy ones end after their job (they never block exit)."""
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)

    @staticmethod
    def _run_one(job: _Job) -> None:
        work, future = job
        del job
        try:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = work()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
        finally:
            # A failed job's traceback holds this frame. Without these names the frame holds neither the
            # future (which holds the exception: a cycle only the garbage collector would break, rarely, as
            # it counts objects, not bytes) nor the work (and the request it closes over, 100s of MB for
            # a refused vocabulary).
            del work, future

    def _work(self) -> None:
        lower_priority(self.nice)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._run_one(job)
            del job  # not kept (with its work's request) while the thread waits for the next one


def _forget(outcome: asyncio.Future[Any]) -> None:
    if not outcome.cancelled():
        outcome.exception()


def lower_priority(nice: int) -> None:
    """Lowers the calling thread's scheduling priority by `nice` (Linux only: there a thread id is a
    scheduling entity of its own; elsewhere the call would name the whole process, or another one)."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    thread = threading.get_native_id()
    # a sandbox may refuse it; the pool works the same, only less politely
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + nice)
