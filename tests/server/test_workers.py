"""The worker pool (constraintd/server/workers.py): off the event loop, time-limited, never blocking exit."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
import weakref

import pytest

from constraintd.errors import DeadlineError, UnavailableError
from constraintd.server.workers import WorkerPool


@pytest.mark.asyncio
async def test_work_runs_in_a_worker_thread_and_returns_its_result() -> None:
    pool = WorkerPool(2, time_limit=30.0)
    try:
        name = await pool.run(lambda: threading.current_thread().name)
        assert name.startswith("constraintd-worker-")
        assert threading.current_thread().name != name
        with pytest.raises(ZeroDivisionError):
            await pool.run(lambda: 1 // 0)
    finally:
        pool.shutdown()


@pytest.mark.asyncio
async def test_the_event_loop_keeps_running_while_work_runs() -> None:
    pool = WorkerPool(1, time_limit=30.0)
    release = threading.Event()
    try:
        job = asyncio.create_task(pool.run(lambda: release.wait(30.0)))
        for _ in range(5):  # the loop answers other tasks while the worker is busy
            await asyncio.sleep(0)
        assert not job.done()
        release.set()
        assert await job is True
    finally:
        pool.shutdown()


@pytest.mark.asyncio
async def test_work_past_the_time_limit_is_a_deadline_error_and_runs_on() -> None:
    pool = WorkerPool(1, time_limit=0.05)
    release = threading.Event()
    finished = threading.Event()

    def slow() -> None:
        release.wait(30.0)
        finished.set()

    try:
        with pytest.raises(DeadlineError, match=r"compiling ran past its time limit of 0\.05 s"):
            await pool.run(slow, what="compiling")
        assert not finished.is_set()
        release.set()
        assert await asyncio.to_thread(finished.wait, 30.0)
    finally:
        pool.shutdown()


@pytest.mark.asyncio
async def test_a_job_still_queued_at_its_time_limit_never_starts() -> None:
    pool = WorkerPool(1, time_limit=0.1)
    release = threading.Event()
    started: list[str] = []

    def job(name: str) -> None:
        started.append(name)
        release.wait(30.0)

    try:
        first = asyncio.ensure_future(pool.run(lambda: job("first"), what="first"))
        while not started:  # the worker holds `first`
            await asyncio.sleep(0.001)
        with pytest.raises(DeadlineError):
            await pool.run(lambda: job("second"), what="second")  # behind `first` until its time is up
        release.set()
        with pytest.raises(DeadlineError):
            await first
        finished = threading.Event()
        await pool.run(finished.set)  # the worker is past both: the second was skipped, not run
        assert started == ["first"]
    finally:
        release.set()
        pool.shutdown()


@pytest.mark.asyncio
async def test_a_shut_down_pool_takes_no_work() -> None:
    pool = WorkerPool(1, time_limit=1.0)
    pool.shutdown()
    with pytest.raises(UnavailableError):
        await pool.run(lambda: None)


def test_workers_are_daemon_threads() -> None:
    pool = WorkerPool(3, time_limit=1.0, name="probe")
    try:
        names = [t for t in threading.enumerate() if t.name.startswith("probe-")]
        assert len(names) == 3 and all(t.daemon for t in names)
    finally:
        pool.shutdown()
    with pytest.raises(ValueError, match="at least one thread"):
        WorkerPool(0, time_limit=1.0)


@pytest.mark.asyncio
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own priority is Linux's")
async def test_workers_run_at_a_lower_priority_than_the_event_loop() -> None:
    def priority() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    ours = priority()
    lowered, plain = WorkerPool(1, time_limit=30.0, nice=5), WorkerPool(1, time_limit=30.0, nice=0)
    try:
        assert await lowered.run(priority) == min(ours + 5, 19)
        assert await plain.run(priority) == ours
        assert priority() == ours  # the loop's thread keeps its own
    finally:
        lowered.shutdown()
        plain.shutdown()


class Request:
    """Stands for a large request a job closes over (a refused vocabulary's can be 100s of MB)."""


@pytest.mark.asyncio
async def test_a_failed_job_frees_what_its_work_held_without_the_garbage_collector() -> None:
    # The error's traceback holds the frames it came through and the futures hold the error: cycles that
    # kept a refused request alive until the collector ran (it counts objects, not bytes), and a worker's
    # last job stayed alive while the worker waited for the next
    pool = WorkerPool(1, time_limit=5.0)
    request = Request()
    alive = weakref.ref(request)

    def work(held: Request = request) -> None:
        raise ValueError("refused")

    gc.disable()
    try:
        failed = False
        try:
            await pool.run(work)
        except ValueError:
            failed = True
        del work, request
        # the caller may resume before the worker thread has left the job: give it a moment
        for _ in range(200):
            if alive() is None:
                break
            await asyncio.sleep(0.005)
        assert failed and alive() is None
    finally:
        gc.enable()
        pool.shutdown()
