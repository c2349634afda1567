"""The session store (constraintd/service/sessions.py): ids, idle expiry with an injected clock, limits."""

from __future__ import annotations

import base64
import dataclasses
import time
from collections.abc import Callable

import pytest

from constraintd.engine import matcher as matcher_module
from constraintd.engine.matcher import ACCEPT_BYTES_CHECK
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import (
    DeadlineError,
    InputError,
    LimitError,
    NotFoundError,
    PositionError,
    TokenError,
    UnavailableError,
)
from constraintd.service import sessions as sessions_module
from constraintd.service.constraints import Constraint, ConstraintKind
from constraintd.service.limits import Limits
from constraintd.service.registry import CompiledConstraint, Registry
from constraintd.service.sessions import ID_BYTES, REPLAY_CHECK, SessionStore
from tests.server.running import AB_PLUS, TINY_EOG, TINY_PIECES

A, B = 3, 4


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def compiled() -> CompiledConstraint:
    registry = Registry(Limits())
    vocab = registry.register_pieces(TINY_PIECES, TINY_EOG)
    return registry.compile(Constraint(ConstraintKind.GBNF, AB_PLUS), vocab)


def store_with(clock: Clock, **limits: float) -> SessionStore:
    return SessionStore(dataclasses.replace(Limits(), **limits), clock=clock)  # type: ignore[arg-type]


def test_ids_are_random_url_safe_and_distinct(compiled: CompiledConstraint) -> None:
    store = store_with(Clock())
    ids = {store.open(compiled).id for _ in range(200)}
    assert len(ids) == 200
    for session_id in ids:
        assert len(base64.urlsafe_b64decode(session_id + "=" * (-len(session_id) % 4))) == ID_BYTES


def test_an_idle_session_expires_after_its_ttl_and_use_pushes_the_deadline(
    compiled: CompiledConstraint,
) -> None:
    clock = Clock()
    store = store_with(clock, default_ttl=10.0)
    session = store.open(compiled)
    clock.now += 9.0
    assert store.get(session.id) is session  # used: the deadline moves to now + 10
    clock.now += 9.0
    assert store.get(session.id) is session
    clock.now += 10.0
    with pytest.raises(NotFoundError, match="no open session"):
        store.get(session.id)
    assert len(store) == 0


def test_a_lookup_at_a_given_moment_expires_and_pushes_the_deadline_from_it(
    compiled: CompiledConstraint,
) -> None:
    clock = Clock()
    store = store_with(clock, default_ttl=10.0)
    session = store.open(compiled)
    moment = store.now()
    clock.now += 30.0  # the clock runs on; lookups at `moment` still see the session alive
    assert store.get(session.id, now=moment + 9.0) is session
    assert session.expires_at == moment + 19.0
    with pytest.raises(NotFoundError):
        store.get(session.id, now=moment + 19.0)


def test_reclaim_removes_only_expired_sessions(compiled: CompiledConstraint) -> None:
    clock = Clock()
    store = store_with(clock, default_ttl=10.0)
    old = [store.open(compiled) for _ in range(3)]
    clock.now += 5.0
    young = store.open(compiled, ttl=60.0)
    clock.now += 6.0
    assert store.reclaim() == 3
    assert len(store) == 1
    assert store.get(young.id) is young
    for session in old:
        with pytest.raises(NotFoundError):
            store.get(session.id)


def test_a_requested_ttl_is_capped_by_the_maximum(compiled: CompiledConstraint) -> None:
    store = store_with(Clock(), default_ttl=10.0, max_ttl=30.0)
    assert store.open(compiled, ttl=1e9).ttl == 30.0
    assert store.open(compiled).ttl == 10.0
    assert store.open(compiled, ttl=5.0).ttl == 5.0


def test_the_session_limit_refuses_then_frees_after_reclaiming(compiled: CompiledConstraint) -> None:
    clock = Clock()
    store = store_with(clock, max_sessions=2, default_ttl=10.0)
    first, second = store.open(compiled), store.open(compiled)
    with pytest.raises(LimitError, match="2 sessions are open, the limit"):
        store.open(compiled)
    with pytest.raises(LimitError):
        store.fork(first.id)
    store.close(second.id)
    store.open(compiled)
    clock.now += 11.0  # both expire; opening reclaims them first
    store.open(compiled)
    assert len(store) == 1


def test_prefill_and_replay(compiled: CompiledConstraint) -> None:
    store = store_with(Clock())
    session = store.open(compiled, prefill=b"a", replay=[B, B])
    assert session.position == 2
    assert session.matcher.history == (B, B)
    assert session.matcher.is_complete()
    with pytest.raises(InputError, match="rejects the prefill"):
        store.open(compiled, prefill=b"b")
    with pytest.raises(InputError, match="rejects replayed token 3 at position 1"):
        store.open(compiled, replay=[A, A])
    with pytest.raises(TokenError):
        store.open(compiled, replay=[999])


def test_adopt_counts_the_replayed_tokens_or_is_told_them(compiled: CompiledConstraint) -> None:
    # the server tells the count (a million-token history counted on the event loop held it 50 ms)
    store = store_with(Clock())
    counted = store.adopt(compiled, store.start(compiled, prefill=b"a", replay=[B, B]))
    told = store.adopt(compiled, store.start(compiled, prefill=b"a", replay=[B, B]), replayed=2)
    assert counted.position == told.position == 2
    assert told.matcher.history == (B, B)
    # past the rollback window: the position is every token accepted, not the few the window keeps
    store = store_with(Clock(), max_rollback=4)
    replay = [A] + [B] * 999
    counted = store.adopt(compiled, store.start(compiled, replay=replay))
    told = store.adopt(compiled, store.start(compiled, replay=replay), replayed=1000)
    assert counted.position == told.position == counted.matcher.position == 1000
    assert counted.matcher.history == (B,) * 4


def test_every_session_gets_the_rollback_window_of_the_limits(compiled: CompiledConstraint) -> None:
    assert Limits().max_rollback == 16_384
    store = store_with(Clock(), max_rollback=8)
    session = store.open(compiled, prefill=b"a", replay=[B] * 100)
    assert session.matcher.max_rollback == 8
    assert store.fork(session.id).matcher.max_rollback == 8
    with pytest.raises(InputError, match=r"keeps only its last 8 \(the rollback window, max_rollback\)"):
        session.rollback(9)
    assert session.position == 100  # refused: nothing changed
    session.rollback(5)
    assert session.position == 95 and session.matcher.history == (B,) * 3
    # the window was partly used: what is left of it, not the whole of it, may be undone
    with pytest.raises(InputError, match="rollback window"):
        session.rollback(4)
    assert session.accept(B) and session.position == 96
    session.rollback(4)
    assert session.position == 92 and session.matcher.is_complete()


def past_one_at_the_second_reading() -> Callable[[], float]:
    """A clock that reads 0.0 once, then 2.0: a deadline of 1.0 passes at its second reading."""
    readings = iter((0.0,))
    return lambda: next(readings, 2.0)


def test_a_replay_past_its_deadline_stops_there(compiled: CompiledConstraint) -> None:
    store = store_with(Clock())
    long_replay = [A] + [B] * (3 * REPLAY_CHECK)
    with pytest.raises(DeadlineError, match="at token 0"):
        store.start(compiled, replay=long_replay, deadline=time.monotonic() - 1.0)
    # a deadline met while replaying: the replay stops at the next check, not at its end
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sessions_module.time, "monotonic", past_one_at_the_second_reading())
        with pytest.raises(DeadlineError, match=f"at token {REPLAY_CHECK}"):
            store.start(compiled, replay=long_replay, deadline=1.0)
    assert store.start(compiled, replay=long_replay, deadline=time.monotonic() + 60).history == tuple(
        long_replay
    )


def test_a_prefill_past_its_deadline_stops_there(compiled: CompiledConstraint) -> None:
    store = store_with(Clock())
    long_prefill = b"a" + b"b" * (3 * ACCEPT_BYTES_CHECK)
    with pytest.raises(DeadlineError, match="at code point 0"):
        store.start(compiled, prefill=long_prefill, deadline=time.monotonic() - 1.0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matcher_module.time, "monotonic", past_one_at_the_second_reading())
        with pytest.raises(DeadlineError, match=f"at code point {ACCEPT_BYTES_CHECK}"):
            store.start(compiled, prefill=long_prefill, deadline=1.0)
    assert store.start(compiled, prefill=long_prefill, deadline=time.monotonic() + 60).is_complete()


def test_a_prefill_over_the_limit_is_refused(compiled: CompiledConstraint) -> None:
    store = store_with(Clock(), max_prefill_bytes=4)
    with pytest.raises(LimitError, match="prefill of 5 bytes"):
        store.open(compiled, prefill=b"abbbb")


def test_accept_and_rollback_keep_the_position(compiled: CompiledConstraint) -> None:
    store = store_with(Clock())
    session = store.open(compiled)
    assert not session.accept(B)
    assert session.position == 0
    assert session.accept(A) and session.accept(B)
    assert session.position == 2
    session.rollback(1)
    assert session.position == 1
    assert session.matcher.history == (A,)
    with pytest.raises(InputError, match="cannot roll back 2 tokens"):
        session.rollback(2)


def test_a_position_that_differs_is_refused(compiled: CompiledConstraint) -> None:
    store = store_with(Clock())
    session = store.open(compiled, replay=[A])
    assert store.get(session.id, position=1) is session
    with pytest.raises(PositionError, match="has accepted 1 tokens, not 0"):
        store.get(session.id, position=0)
    assert PositionError.status == "ABORTED"


def test_fork_copies_the_state_and_the_copies_go_separate_ways(compiled: CompiledConstraint) -> None:
    store = store_with(Clock())
    parent = store.open(compiled, replay=[A])
    child = store.fork(parent.id)
    assert child.id != parent.id and child.position == 1
    assert child.accept(B)
    assert parent.position == 1 and parent.matcher.history == (A,)
    assert child.matcher.history == (A, B)


def test_close_and_shutdown(compiled: CompiledConstraint) -> None:
    store = store_with(Clock())
    session = store.open(compiled)
    store.close(session.id)
    with pytest.raises(NotFoundError):
        store.close(session.id)
    kept = store.open(compiled)
    store.stop_opening()
    with pytest.raises(UnavailableError, match="shutting down"):
        store.open(compiled)
    with pytest.raises(UnavailableError):
        store.fork(kept.id)
    assert store.get(kept.id) is kept  # open sessions keep working while the server drains
    assert store.release_all() == 1
    assert len(store) == 0


def test_a_grammar_whose_stacks_exceed_the_limit_is_refused() -> None:
    registry = Registry(Limits())
    vocab = Vocab(TINY_PIECES, TINY_EOG)
    # every alternate of `x` is a separate stack: 11 of them at the start
    grammar = "root ::= x x\nx ::= " + " | ".join(f'"{c}"' for c in "ab12:, {}tn")
    compiled = registry.compile(Constraint(ConstraintKind.GBNF, grammar), vocab)
    store = store_with(Clock(), max_stacks=4)
    with pytest.raises(LimitError, match="stacks"):
        store.open(compiled)
