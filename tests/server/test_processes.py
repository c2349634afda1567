"""The compile process pool (constraintd/server/processes.py): real worker processes running real compiles,
errors that cross the process boundary unchanged, and processes stopped and replaced."""

from __future__ import annotations

import logging
import os
import pickle
import select
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from constraintd.errors import ConstraintdError, DeadlineError, GrammarError, SchemaError, UnavailableError
from constraintd.server.processes import ProcessPool
from constraintd.service.constraints import Constraint, ConstraintKind, PreparedGrammar, prepare

SCHEMA = '{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}'
PRELOAD = [prepare.__module__]


@pytest.fixture
def pool() -> Iterator[ProcessPool]:
    pool = ProcessPool(1, time_limit=30.0, preload=PRELOAD)
    try:
        yield pool
    finally:
        pool.close()


def same_preparation(a: PreparedGrammar, b: PreparedGrammar) -> bool:
    # Rules has no __eq__: compare what it holds
    assert a.rules is not None and b.rules is not None
    same_rules = all(getattr(a.rules, name) == getattr(b.rules, name) for name in a.rules.__slots__)
    return a.resolved == b.resolved and a.parsed == b.parsed and same_rules


def announce_then_sleep(fifo: str) -> None:
    """A job that says it has begun (its process id, through a FIFO the test reads), then never ends."""
    with open(fifo, "w") as announce:
        announce.write(str(os.getpid()))
    time.sleep(3600)


def test_a_compile_runs_in_a_reused_worker_process_and_equals_one_in_process(pool: ProcessPool) -> None:
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, SCHEMA)
    assert pool.pids == []  # started on first need
    prepared = pool.run(prepare, constraint, what="compiling")
    assert same_preparation(prepared, prepare(constraint))
    (worker,) = pool.pids
    assert worker != os.getpid()
    assert pool.run(os.getpid) == worker
    assert pool.pids == [worker]


ERRORS: dict[str, tuple[Constraint, type[ConstraintdError]]] = {
    "gbnf-syntax": (Constraint(ConstraintKind.GBNF, 'root ::= "a" [b'), GrammarError),
    "gbnf-no-root": (Constraint(ConstraintKind.GBNF, 'start ::= "a"'), GrammarError),
    "gbnf-left-recursion": (Constraint(ConstraintKind.GBNF, 'root ::= root "a" | "b"'), GrammarError),
    "schema-not-json": (Constraint(ConstraintKind.JSON_SCHEMA, "{not json"), SchemaError),
    "schema-bad-node": (
        Constraint(ConstraintKind.JSON_SCHEMA, '{"properties": {"a": {"$ref": "#/nowhere"}}}'),
        SchemaError,
    ),
    "request-not-object": (Constraint(ConstraintKind.OPENAI_REQUEST, "[]"), SchemaError),
}


@pytest.mark.parametrize("case", list(ERRORS), ids=list(ERRORS))
def test_an_error_in_the_worker_reaches_the_caller_as_raised_in_process(pool: ProcessPool, case: str) -> None:
    constraint, kind = ERRORS[case]
    with pytest.raises(kind) as here:
        prepare(constraint)
    with pytest.raises(kind) as there:
        pool.run(prepare, constraint)
    assert type(there.value) is type(here.value)
    assert str(there.value) == str(here.value)
    assert vars(there.value) == vars(here.value)  # line, column, excerpt; JSON pointer
    assert there.value.status == here.value.status


def test_a_bug_in_the_worker_is_a_runtime_error_with_its_traceback(pool: ProcessPool) -> None:
    with pytest.raises(RuntimeError) as caught:
        pool.run(int, "not a number", what="counting")
    assert str(caught.value).startswith("counting failed in a worker process:\nTraceback")
    assert "ValueError: invalid literal for int() with base 10: 'not a number'" in str(caught.value)
    assert pool.run(len, "still works") == 11


def test_a_job_the_worker_cannot_load_is_a_bug(pool: ProcessPool, monkeypatch: pytest.MonkeyPatch) -> None:
    # a function of a module only this process has: the worker fails to import it
    module = types.ModuleType("only_in_the_server")
    exec("def job():\n    return 1\n", module.__dict__)
    monkeypatch.setitem(sys.modules, "only_in_the_server", module)
    with pytest.raises(RuntimeError, match="No module named 'only_in_the_server'"):
        pool.run(module.job)
    assert pool.run(len, "still works") == 11


class Unpicklable(ConstraintdError):
    """An error holding something that does not pickle (a lambda): it cannot cross, a bug too."""

    def __init__(self) -> None:
        super().__init__("cannot cross")
        self.callback = lambda: None


def raise_unpicklable() -> None:
    raise Unpicklable


def test_an_error_that_cannot_cross_the_boundary_is_a_bug(pool: ProcessPool) -> None:
    with pytest.raises(RuntimeError, match="Unpicklable"):
        pool.run(raise_unpicklable)


def test_a_job_past_the_time_limit_is_stopped_and_its_process_replaced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = ProcessPool(1, time_limit=0.5, preload=PRELOAD, name="test-pool")
    try:
        first = pool.run(os.getpid)
        with (
            caplog.at_level(logging.INFO, logger="constraintd.server"),
            pytest.raises(DeadlineError, match=r"^sleeping ran past its time limit of 0\.5 s$"),
        ):
            pool.run(time.sleep, 3600, what="sleeping")
        (second,) = pool.pids
        assert second != first
        constraint = Constraint(ConstraintKind.JSON_SCHEMA, SCHEMA)
        assert same_preparation(pool.run(prepare, constraint), prepare(constraint))
        assert pool.pids == [second]
    finally:
        pool.close()
    stopped = [r for r in caplog.records if r.getMessage() == "worker process stopped"]
    started = [r for r in caplog.records if r.getMessage() == "worker process started"]
    assert [r.__dict__["fields"]["pid"] for r in stopped] == [first]
    assert stopped[0].__dict__["fields"]["reason"] == "past its time limit"
    # the first start is logged too when the logger already lets INFO through
    assert [r.__dict__["fields"]["pid"] for r in started if r.__dict__["fields"]["pid"] != first] == [second]
    assert started[-1].__dict__["fields"]["pool"] == "test-pool"


def test_a_worker_killed_during_a_job_is_replaced(pool: ProcessPool, tmp_path: Path) -> None:
    fifo = tmp_path / "begun"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            pool.run(announce_then_sleep, str(fifo), what="compiling the constraint")
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    with fifo.open() as begun:  # opens once the job has begun in the worker
        victim = int(begun.read())
    os.kill(victim, 9)
    caller.join(60)
    (error,) = outcome
    assert isinstance(error, UnavailableError)
    assert str(error) == (
        "the worker process compiling the constraint ended before it finished; a new one replaces it"
    )
    (replacement,) = pool.pids
    assert replacement != victim
    assert pool.run(prepare, Constraint(ConstraintKind.JSON_OBJECT)).parsed is not None


def test_a_worker_that_died_while_idle_is_replaced_for_the_next_job(pool: ProcessPool) -> None:
    victim = pool.run(os.getpid)
    death = os.pidfd_open(victim)
    try:
        os.kill(victim, 9)
        select.select([death], [], [], 60)  # readable once the process has ended
    finally:
        os.close(death)
    replacement = pool.run(os.getpid)
    assert replacement != victim
    assert pool.pids == [replacement]


def test_closing_stops_the_workers_and_refuses_jobs(tmp_path: Path) -> None:
    pool = ProcessPool(2, time_limit=30.0, preload=PRELOAD)
    fifo = tmp_path / "begun"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            pool.run(announce_then_sleep, str(fifo))
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    with fifo.open() as begun:
        busy = int(begun.read())
    idle = pool.run(os.getpid)
    assert sorted(pool.pids) == sorted([busy, idle])
    pool.close()
    caller.join(60)
    assert pool.pids == []
    for pid in (busy, idle):  # ended and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    (error,) = outcome
    assert isinstance(error, UnavailableError)
    with pytest.raises(UnavailableError, match="shutting down"):
        pool.run(os.getpid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="os.nice as Linux has it")
def test_workers_run_at_a_lower_priority_than_the_server() -> None:
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    lowered = ProcessPool(1, time_limit=30.0, nice=5)
    plain = ProcessPool(1, time_limit=30.0, nice=0)
    try:
        assert lowered.run(os.getpriority, os.PRIO_PROCESS, 0) == min(ours + 5, 19)
        assert plain.run(os.getpriority, os.PRIO_PROCESS, 0) == ours
    finally:
        lowered.close()
        plain.close()


def test_a_pool_needs_a_process() -> None:
    with pytest.raises(ValueError, match="at least one process"):
        ProcessPool(0, time_limit=1.0)


def test_a_preparation_pickles_to_an_equal_one() -> None:
    prepared = prepare(Constraint(ConstraintKind.JSON_SCHEMA, SCHEMA))
    assert same_preparation(pickle.loads(pickle.dumps(prepared)), prepared)
