# A thread of its own for mask-ahead's constraintd calls, handed over at the least cost to the caller.
#
# Mask-ahead hands one call a step to another thread just before the forward pass, and takes its answer
# just after: both hand-offs are on the step's critical path, the call itself is not. A
# `ThreadPoolExecutor` costs the caller 35-55 µs a step there (its future's condition, work item, idle
# semaphore and shutdown locks); this costs a queue put to hand a call over and a lock to take its answer.
#
# Contract:
# - `CallThread.submit(call)` runs `call()` on the thread, after the calls submitted before it, and returns
#   a `PendingCall` at once; `PendingCall.result()` waits for the call and returns what it returned, or
#   raises what it raised; `done()` says whether it has finished (never blocks).
# - `close()` lets the calls submitted run, then ends the thread and waits for it; no call is submitted
#   after it.
from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["CallThread", "PendingCall"]

T = TypeVar("T")


class PendingCall(Generic[T]):
    """A call handed to a `CallThread`: its answer once it has run."""

    __slots__ = ("_call", "_error", "_finished", "_value")

    def __init__(self, call: Callable[[], T]) -> None:
        self._call = call
        self._value: T | None = None
        self._error: BaseException | None = None
        # held until the call has run: released by the thread that runs it (a Lock may be, an RLock not)
        self._finished = threading.Lock()
        self._finished.acquire()

    def run(self) -> None:
        try:
            self._value = self._call()
        except BaseException as error:  # the caller's to see, from result()
            self._error = error
        finally:
            self._finished.release()

    def done(self) -> bool:
        """Whether the call has run (does not wait)."""
        return not self._finished.locked()

    def result(self) -> T:
        """What the call returned, waiting for it if it has not run.

        Raises:
            BaseException: what the call raised.
        """
        with self._finished:
            pass
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # T, set by run() when no error was raised


class CallThread:
    """A thread that runs the calls handed to it, one at a time, in order.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[PendingCall[Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], T]) -> PendingCall[T]:
        """Hand `call` over to the thread; does not wait for it."""
        pending = PendingCall(call)
        self._calls.put(pending)
        return pending

    def close(self) -> None:
        """Run the calls submitted, then end the thread and wait for it."""
        self._calls.put(None)
        self._thread.join()

    def _work(self) -> None:
        while (pending := self._calls.get()) is not None:
            pending.run()
