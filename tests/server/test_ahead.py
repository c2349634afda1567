"""The lookahead worker (constraintd/server/ahead.py): new grammars' first verdicts learnt while nothing
else is computed, and a server that runs it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable

import grpc
import pytest

from constraintd.engine import Grammar, Vocab
from constraintd.engine.masks.ahead import AheadRun
from constraintd.engine.schema.convert import json_schema_to_gbnf
from constraintd.server.ahead import AheadWorker
from constraintd.v1 import constraintd_pb2 as pb
from constraintd.v1 import constraintd_pb2_grpc as pb_grpc
from tests.server.running import running_service, server_config, socket_dir

PIECES = [b"</s>", b"{", b"}", b'"', b'{"', b'":', b" ", b",", b"1", b"12", b"true", b"tr", b"ue", b'"}']
PIECES += [bytes([byte]) for byte in range(0x20, 0x7F) if bytes([byte]) not in PIECES]


def _grammar(name: str) -> Grammar:
    schema = {"type": "object", "properties": {name: {"type": "integer"}, "ok": {"type": "boolean"}}}
    return Grammar.from_gbnf(json_schema_to_gbnf(json.dumps(schema)), Vocab(PIECES, eog_ids=[0]))


def _until(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.005)


class Runs:
    """What a worker told of its runs, from its thread."""

    def __init__(self) -> None:
        self.runs: list[AheadRun] = []
        self._lock = threading.Lock()

    def __call__(self, run: AheadRun) -> None:
        with self._lock:
            self.runs.append(run)

    def tops(self) -> int:
        with self._lock:
            return sum(run.tops for run in self.runs)


def test_a_queued_grammar_is_searched_within_its_budget() -> None:
    runs = Runs()
    worker = AheadWorker(60.0, on_run=runs)
    try:
        grammar = _grammar("name")
        assert worker.submit(grammar)
        _until(lambda: grammar.lookahead(0.0).finished)
        _until(lambda: worker.queued() == 0)
        assert runs.tops() > 0
        assert not worker.submit(grammar)  # its search is over: nothing left to queue it for
    finally:
        worker.shutdown()


def test_submit_calls_nothing_of_the_grammar(monkeypatch: pytest.MonkeyPatch) -> None:
    # submit runs on the event loop: the first lookahead call makes the search, and can build a
    # vocabulary's tables (hundreds of milliseconds), so only the worker's thread makes it
    callers: list[str] = []
    original = Grammar.lookahead

    def recorded(self: Grammar, *args: object, **kwargs: object) -> AheadRun:
        callers.append(threading.current_thread().name)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Grammar, "lookahead", recorded)
    worker = AheadWorker(60.0)
    try:
        grammar = _grammar("caller")
        assert worker.submit(grammar)
        _until(lambda: worker.queued() == 0)
        assert not worker.submit(grammar)  # its search is over, as the worker found
        assert callers and set(callers) == {"constraintd-lookahead"}
    finally:
        worker.shutdown()


def test_it_waits_while_a_caller_waits_for_a_compile_or_a_mask() -> None:
    runs = Runs()
    worker = AheadWorker(60.0, on_run=runs)
    try:
        grammar = _grammar("count")
        with worker.busy():
            assert worker.submit(grammar)
            assert not worker.submit(grammar)  # queued already
            time.sleep(0.3)
            assert grammar.lookahead(0.0).total == 0.0 and runs.runs == []
        _until(lambda: grammar.lookahead(0.0).finished)
    finally:
        worker.shutdown()


def test_a_busy_caller_pauses_a_run_and_it_resumes_after() -> None:
    started = threading.Event()
    release = threading.Event()
    worker = AheadWorker(60.0)
    grammar = _grammar("size")
    pauses: list[bool] = []
    real = worker._paused

    def paused() -> bool:
        # the first question the run asks (before its first top) comes while a caller is busy
        if not pauses:
            started.set()
            release.wait(10)
        pauses.append(real())
        return pauses[-1]

    worker._paused = paused  # type: ignore[method-assign]
    try:
        busy = worker.busy()
        assert worker.submit(grammar)
        started.wait(10)
        busy.__enter__()
        release.set()
        _until(lambda: len(pauses) >= 1)
        assert pauses[0] is True and grammar.lookahead(0.0).total < 0.05
        busy.__exit__(None, None, None)
        _until(lambda: grammar.lookahead(0.0).finished)
        assert pauses.count(True) == 1
    finally:
        worker.shutdown()


def test_the_budget_is_per_grammar_over_its_life() -> None:
    runs = Runs()
    worker = AheadWorker(1e-9, on_run=runs)  # spent before its first top
    try:
        grammar = _grammar("limit")
        assert worker.submit(grammar)
        _until(lambda: worker.queued() == 0)
        spent = grammar.lookahead(0.0)
        assert not spent.finished and spent.total >= 1e-9 and len(runs.runs) == 1 and runs.tops() <= 1
        assert not worker.submit(grammar)
    finally:
        worker.shutdown()


def test_the_queue_is_bounded_and_a_shut_down_worker_takes_nothing() -> None:
    worker = AheadWorker(60.0, max_queued=2)
    with worker.busy():
        grammars = [_grammar(name) for name in ("a", "b", "c")]
        assert [worker.submit(grammar) for grammar in grammars] == [True, True, False]
        assert worker.queued() == 2
        worker.shutdown()
        assert worker.queued() == 0 and not worker.submit(_grammar("d"))
    worker._thread.join(10)
    assert not worker._thread.is_alive()


@pytest.mark.asyncio
async def test_a_server_learns_a_new_sessions_grammar_ahead_and_counts_it() -> None:
    schema = json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory)) as service,
            grpc.aio.insecure_channel(service.addresses[0]) as channel,
        ):
            stub = pb_grpc.ConstraintdStub(channel)
            pieces = pb.PieceList(pieces=PIECES, eog=[0])
            vocab = await stub.RegisterVocab(pb.RegisterVocabRequest(pieces=pieces))
            await stub.CreateSession(pb.CreateSessionRequest(vocab_id=vocab.vocab_id, json_schema=schema))
            metrics = service.metrics
            deadline = time.monotonic() + 30
            while metrics.lookahead_tops._values[()] == 0:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            assert "constraintd_lookahead_tops_total 0\n" not in metrics.render()
        # off: nothing learnt ahead
        async with running_service(server_config(directory, lookahead_seconds=0.0)) as service:
            assert service._ahead is None
