# Work that must not share the server's GIL, in a few worker processes, with a time limit.
#
# The heavy, vocabulary-free half of a compile (JSON schema to GBNF, the GBNF parse) runs here, so a large
# schema costs the server's event loop only the cheap rest (see service/registry.py), not tens of milliseconds
# of bytecode contending for its GIL.
#
# Invariants:
# - Processes come from the "forkserver" start method: grpc's threads forbid forking the server itself.
#   The fork server is started once per server process, with `preload` imported, so a new worker costs a
#   fork, not an interpreter start and the engine's imports.
# - A job is a module-level function and picklable arguments. What it returns comes back pickled; a
#   `ConstraintdError` it raises comes back as its class, its arguments and its attributes, and is rebuilt
#   from them without calling its constructor (which would write its message again from the parts), so
#   the caller raises exactly what the work raised in-process: same class, message, line and column of a
#   GrammarError, JSON pointer of a SchemaError, and so the same status. Anything else raised in a worker
#   is a bug: the caller gets a RuntimeError carrying the worker's traceback (the server answers INTERNAL
#   and logs it).
# - A caller waits at most `time_limit` seconds from its call, for a free process and for the answer; then
#   it gets DeadlineError, and the process that had its job is killed and replaced (a thread cannot be
#   stopped; a process can). A process that dies during a job (killed, out of memory) is replaced too, and
#   its caller gets UnavailableError; nothing else in the server is harmed.
# - Processes start on first need, not with the pool (a server that compiles nothing starts none), and are
#   reused job after job. Each runs `nice` (19, the lowest, by default) below the priority of the thread
#   that made the pool: when the CPUs are busy, the server's threads run first. Lowest, not 10 as the
#   worker threads: on two cores, a process busy at nice 10 beside the service benchmark tripled Accept's
#   p99; at 19 it moved it by a tenth. The price: a compile gets almost no CPU while the cores are
#   saturated, and may then reach its time limit. (A
#   priority is inherited: the fork server is started with the pool, from that thread, not later from a
#   worker thread already lowered, and a worker sets its priority to the target rather than lowering
#   what it inherited once more.)
# - `close` stops every process; a busy caller then gets UnavailableError. A worker whose server is gone
#   (even killed) exits at its next read, on the end of its pipe; one that is not busy is daemonic and
#   stopped at the server's exit as well.
# - Thread-safe: the callers are the compile worker threads; a process serves one job at a time.
from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from constraintd.errors import ConstraintdError, DeadlineError, UnavailableError
from constraintd.service.log_events import fields

__all__ = ["ProcessPool"]

log = logging.getLogger("constraintd.server")

R = TypeVar("R")

# Seconds a stopped process gets to end after SIGTERM before it is killed.
_STOP_GRACE = 5.0


class _Worker:
    """One worker process and the parent's end of its pipe."""

    __slots__ = ("_ended", "_ending", "connection", "process")

    def __init__(self, process: BaseProcess, connection: Connection) -> None:
        self.process = process
        self.connection = connection
        self._ending = threading.Lock()
        self._ended = False

    def end(self, *, kill: bool = False) -> int | None:
        """Ends the process (SIGKILL, or SIGTERM then SIGKILL after a grace) and returns its exit code;
        None when another thread has ended it already (a deadline meeting a shutdown). The lock makes the
        second caller wait for the first and then do nothing: `Process.close` is not safe to race."""
        with self._ending:
            if self._ended:
                return None
            self._ended = True
            process = self.process
            if process.is_alive():
                if kill:
                    process.kill()
                else:
                    process.terminate()
                process.join(_STOP_GRACE)
                if process.is_alive():
                    process.kill()
            process.join()
            exit_code = process.exitcode
            process.close()
            return exit_code


class ProcessPool:
    """A fixed number of worker processes taking jobs in the order callers get a free one."""

    def __init__(
        self,
        processes: int,
        *,
        time_limit: float,
        name: str = "constraintd-process",
        nice: int = 19,
        preload: Sequence[str] = (),
    ) -> None:
        if processes < 1:
            raise ValueError("a process pool needs at least one process")
        self.time_limit = time_limit
        self.name = name
        self.nice = nice
        # On Linux, PRIO_PROCESS 0 names the calling thread: its nice value, which workers start from.
        self._priority = min(os.getpriority(os.PRIO_PROCESS, 0) + max(nice, 0), 19)
        self._context = multiprocessing.get_context("forkserver")
        # The fork server is one per process: the first pool to start a worker starts it with these
        # modules imported. `__main__` is multiprocessing's own default there (a worker imports the main
        # module unless its parent was run as `python -m package`): imported once, not once per worker.
        self._context.set_forkserver_preload(["__main__", *preload])
        forkserver.ensure_running()  # from this thread, at its priority (its imports run in the background)
        self._lock = threading.Lock()
        self._closed = False
        self._started = 0
        self._workers: set[_Worker] = set()
        # A free slot: its process, or None when it has none yet (started on first need).
        self._free: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        self._size = processes
        for _ in range(processes):
            self._free.put(None)

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers running now (none before the first job)."""
        with self._lock:
            return sorted(w.process.pid for w in self._workers if w.process.pid is not None)

    def run(self, function: Callable[..., R], *args: Any, what: str = "work") -> R:
        """Runs `function(*args)` in a worker process and returns its result, or raises its error.

        Blocks the calling thread (without holding the GIL while the work runs).

        Raises:
            ConstraintdError: what the function raised, as it raised it.
            DeadlineError: no result within the time limit (the process is killed and replaced).
            UnavailableError: the pool is closed, or the process died during the job (it is replaced).
            RuntimeError: the function raised something else (a bug); the message has its traceback.
        """
        deadline = time.monotonic() + self.time_limit
        if self._closed:
            raise UnavailableError("the server is shutting down")
        try:
            worker = self._free.get(timeout=self.time_limit)
        except queue.Empty:
            raise self._deadline(what) from None
        try:
            # an idle worker's pipe has something to read only if it ended (end of file)
            if worker is None or not worker.process.is_alive() or worker.connection.poll():
                reason = "first job" if worker is None else "the last one ended while idle"
                if worker is not None:
                    self._stop(worker, "ended while idle")
                    worker = None
                worker = self._start(reason)
            ok, value = self._ask(worker, (function, args), deadline, what)
        except _Stopped as stopped:
            worker = stopped.replacement
            raise stopped.error from None
        finally:
            self._release(worker)
        if ok:
            return value  # type: ignore[no-any-return]
        if isinstance(value, str):
            raise RuntimeError(f"{what} failed in a worker process:\n{value}")
        kind, args, attributes = value
        raise kind.rebuilt(args, attributes)

    def close(self) -> None:
        """Takes no more jobs and stops every process (a busy caller gets UnavailableError)."""
        with self._lock:
            self._closed = True
            workers = list(self._workers)
            self._workers.clear()
        for worker in workers:
            worker.end()
        with contextlib.suppress(queue.Empty):
            while True:
                free = self._free.get_nowait()
                if free is not None:
                    free.connection.close()
        for _ in range(self._size):  # wake callers waiting for a process: they find the pool closed
            self._free.put(None)

    def _ask(
        self, worker: _Worker, job: tuple[Callable[..., Any], tuple[Any, ...]], deadline: float, what: str
    ) -> tuple[bool, Any]:
        try:
            worker.connection.send(job)
            if not worker.connection.poll(max(0.0, deadline - time.monotonic())):
                raise _Stopped(self._deadline(what), self._stop_and_replace(worker, "past its time limit"))
            reply = worker.connection.recv_bytes()
        except (EOFError, OSError):
            if self._closed:
                self._forget(worker)
                raise _Stopped(UnavailableError("the server is shutting down"), None) from None
            error = UnavailableError(
                f"the worker process {what} ended before it finished; a new one replaces it"
            )
            raise _Stopped(error, self._stop_and_replace(worker, "ended during a job")) from None
        answer: tuple[bool, Any] = pickle.loads(reply)
        return answer

    def _deadline(self, what: str) -> DeadlineError:
        return DeadlineError(f"{what} ran past its time limit of {self.time_limit:g} s")

    def _start(self, reason: str) -> _Worker:
        with self._lock:
            if self._closed:
                raise UnavailableError("the server is shutting down")
            self._started += 1
            ours, theirs = self._context.Pipe()
            process = self._context.Process(
                target=_serve, args=(theirs, self._priority), name=f"{self.name}-{self._started}", daemon=True
            )
            process.start()
            theirs.close()
            worker = _Worker(process, ours)
            self._workers.add(worker)
        log.info("worker process started", extra=fields(pool=self.name, pid=process.pid, reason=reason))
        return worker

    def _stop_and_replace(self, worker: _Worker, reason: str) -> _Worker | None:
        self._stop(worker, reason)
        try:
            return self._start(f"replacing one {reason}")
        except Exception:  # closed meanwhile, or the system refuses: the next job tries again
            log.warning("worker process not replaced", exc_info=True, extra=fields(pool=self.name))
            return None

    def _stop(self, worker: _Worker, reason: str) -> None:
        self._forget(worker)
        pid = worker.process.pid
        exit_code = worker.end(kill=True)
        log.warning(
            "worker process stopped",
            extra=fields(pool=self.name, pid=pid, reason=reason, exit_code=exit_code),
        )

    def _forget(self, worker: _Worker) -> None:
        with self._lock:
            self._workers.discard(worker)
        worker.connection.close()

    def _release(self, worker: _Worker | None) -> None:
        if self._closed and worker is not None:  # close() has ended its process
            self._forget(worker)
            worker = None
        self._free.put(worker)


class _Stopped(Exception):
    """A job's process was stopped: the error for its caller, and the process now in its slot."""

    def __init__(self, error: ConstraintdError, replacement: _Worker | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.replacement = replacement


# --- in the worker process ---


def _serve(connection: Connection, priority: int) -> None:
    """A worker's life: take its priority (a nice value), then answer jobs until its pipe ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the server's to handle
    if os.getpriority(os.PRIO_PROCESS, 0) < priority:  # only lowered: raising one needs privileges
        with contextlib.suppress(OSError):  # a sandbox may refuse it; the work is the same
            os.setpriority(os.PRIO_PROCESS, 0, priority)
    while True:
        try:
            job = connection.recv_bytes()
        except (EOFError, OSError):  # the server closed its end, or is gone
            return
        try:
            function, args = pickle.loads(job)
        except Exception:  # a function this process cannot import, say
            reply = _bug()
        else:
            reply = _outcome(function, args)
        try:
            connection.send_bytes(reply)
        except OSError:
            return


def _outcome(function: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    """The pickled (ok, value) of one job: its result; its ConstraintdError as (class, args, attributes);
    or, for anything else, the traceback."""
    try:
        return pickle.dumps((True, function(*args)), pickle.HIGHEST_PROTOCOL)
    except ConstraintdError as error:
        try:
            reply = pickle.dumps((False, (type(error), error.args, vars(error))), pickle.HIGHEST_PROTOCOL)
            pickle.loads(reply)  # an error that cannot be rebuilt from its pickle is a bug too
        except Exception:
            return _bug()
        return reply
    except Exception:
        return _bug()


def _bug() -> bytes:
    return pickle.dumps((False, traceback.format_exc()), pickle.HIGHEST_PROTOCOL)


