"""sampler_worker.call_thread: calls run on a thread of their own, in order, each answered once it has run."""

from __future__ import annotations

import threading
from functools import partial

import pytest

from sampler_worker.call_thread import CallThread


def test_calls_run_in_order_on_the_thread_and_answer_what_they_return() -> None:
    worker = CallThread("test-calls")
    try:
        ran: list[tuple[int, str]] = []

        def call(n: int) -> int:
            ran.append((n, threading.current_thread().name))
            return n * n

        pending = [worker.submit(partial(call, n)) for n in range(5)]
        assert [p.result() for p in pending] == [0, 1, 4, 9, 16]
        assert ran == [(n, "test-calls") for n in range(5)]
        assert all(p.done() for p in pending)
    finally:
        worker.close()


def test_a_result_waits_for_its_call_and_done_does_not() -> None:
    worker = CallThread("test-wait")
    try:
        release, started = threading.Event(), threading.Event()

        def slow() -> str:
            started.set()
            release.wait()
            return "late"

        pending = worker.submit(slow)
        started.wait()
        assert not pending.done()
        threading.Timer(0.05, release.set).start()
        assert pending.result() == "late"  # waited for the call
        assert pending.done()
    finally:
        worker.close()


def test_what_a_call_raises_is_raised_by_its_result_and_the_thread_goes_on() -> None:
    worker = CallThread("test-raise")
    try:

        def fails() -> int:
            raise KeyError("no such session")

        failed = worker.submit(fails)
        with pytest.raises(KeyError, match="no such session"):
            failed.result()
        assert worker.submit(lambda: 7).result() == 7
    finally:
        worker.close()


def test_close_runs_the_calls_submitted_then_ends_the_thread() -> None:
    worker = CallThread("test-close")
    gate = threading.Event()
    first, second = worker.submit(gate.wait), worker.submit(lambda: "after")
    gate.set()
    worker.close()
    assert first.done() and second.done()
    assert second.result() == "after"
    assert not any(thread.name == "test-close" for thread in threading.enumerate())
