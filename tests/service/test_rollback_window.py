"""A session's rollback window (`Limits.max_rollback`) over the in-process transport: the position stays every
token accepted, and a Rollback past the window is refused (InputError: INVALID_ARGUMENT on the wire), naming
the window, with nothing changed."""

from __future__ import annotations

import dataclasses

import pytest

from clients import Client
from clients.transports.local import LocalTransport
from constraintd.errors import InputError
from constraintd.service.limits import Limits
from constraintd.v1 import constraintd_pb2 as pb
from tests.server.running import AB_PLUS, TINY_EOG, TINY_PIECES

A, B = 3, 4
WINDOW = 16


@pytest.fixture
def transport() -> LocalTransport:
    return LocalTransport(dataclasses.replace(Limits(), max_rollback=WINDOW))


def call(transport: LocalTransport, method: str, request: object) -> pb.RollbackResponse:
    reply: pb.RollbackResponse = transport.call(method, request, timeout=None)
    return reply


def test_a_replayed_session_counts_every_token_and_rolls_back_only_inside_its_window(
    transport: LocalTransport,
) -> None:
    vocab = transport.call(
        "RegisterVocab",
        pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=TINY_PIECES, eog=TINY_EOG)),
        timeout=None,
    )
    created = transport.call(
        "CreateSession",
        pb.CreateSessionRequest(vocab_id=vocab.vocab_id, gbnf=pb.Gbnf(text=AB_PLUS), replay=[A] + [B] * 999),
        timeout=None,
    )
    session_id = created.session_id
    assert created.state.position == 1000
    too_far = pb.RollbackRequest(session_id=session_id, count=WINDOW + 1, position=1000)
    with pytest.raises(InputError, match=f"keeps only its last {WINDOW} \\(the rollback window") as refused:
        call(transport, "Rollback", too_far)
    assert refused.value.status == "INVALID_ARGUMENT"
    # refused, nothing changed: the position is still 1000
    rollback = pb.RollbackRequest(session_id=session_id, count=WINDOW, position=1000)
    rolled = call(transport, "Rollback", rollback)
    assert rolled.state.position == 1000 - WINDOW and rolled.state.complete
    with pytest.raises(InputError, match="rollback window"):  # the window is used up
        call(transport, "Rollback", pb.RollbackRequest(session_id=session_id, count=1))
    accepted = transport.call("Accept", pb.AcceptRequest(session_id=session_id, token=B), timeout=None)
    assert accepted.accepted and accepted.state.position == 1000 - WINDOW + 1
    forked = transport.call("Fork", pb.ForkRequest(session_id=session_id), timeout=None)
    assert forked.state.position == 1000 - WINDOW + 1
    back = call(transport, "Rollback", pb.RollbackRequest(session_id=forked.session_id, count=1))
    assert back.state.position == 1000 - WINDOW  # the fork kept the window and what was left of it
    with pytest.raises(InputError, match="rollback window"):
        call(transport, "Rollback", pb.RollbackRequest(session_id=forked.session_id, count=1))


def test_the_client_gets_the_refusal_and_keeps_its_tokens(transport: LocalTransport) -> None:
    with Client("local", transport=transport) as client:
        vocab = client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
        with client.session(vocab, gbnf=AB_PLUS) as session:
            assert session.accept(A)
            for _ in range(3 * WINDOW):
                assert session.accept(B)
            with pytest.raises(InputError, match="rollback window"):
                session.rollback(WINDOW + 1)
            assert session.history == (A,) + (B,) * (3 * WINDOW)
            session.rollback(WINDOW)
            assert session.history == (A,) + (B,) * (2 * WINDOW)
            assert session.accept(B) and session.is_complete()


def test_a_negative_window_is_refused_with_the_limits() -> None:
    with pytest.raises(ValueError, match="max_rollback is a number of steps, 0 or more, not -1"):
        dataclasses.replace(Limits(), max_rollback=-1)
    assert Limits(max_rollback=0).max_rollback == 0  # no rollback at all
