"""Every RPC of constraintd.v1.Constraintd over a real grpc.aio server (Unix socket and TCP), and every
error path with its status and message (constraintd/server/servicer.py, service/operations.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import numpy as np
import pytest
import pytest_asyncio
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from constraintd.engine.grammar.compiled import Grammar
from constraintd.engine.matcher import Matcher
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import ConstraintdError, GrammarError, NotFoundError, PositionError
from constraintd.server.lifecycle import Service
from constraintd.server.servicer import status_of
from constraintd.service import registry as registry_module
from constraintd.service.constraints import Constraint, PreparedGrammar, prepare
from constraintd.service.limits import Limits
from constraintd.service.status import status_for
from constraintd.v1 import constraintd_pb2 as pb
from constraintd.v1 import constraintd_pb2_grpc as pb_grpc
from tests import reference
from tests.server.running import (
    AB_PLUS,
    EOS,
    TINY_EOG,
    TINY_PIECES,
    running_service,
    server_config,
    socket_dir,
)

A, B, AB, C_ACUTE_1, C_ACUTE_2 = 3, 4, 10, 18, 19
Stub = Any  # the generated stub is untyped


def tiny_registration() -> pb.RegisterVocabRequest:
    return pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=TINY_PIECES, eog=TINY_EOG))


def engine_mask(grammar: str, tokens: Sequence[int] = ()) -> np.ndarray:
    matcher = Matcher(Grammar.from_gbnf(grammar, Vocab(TINY_PIECES, TINY_EOG)))
    for token in tokens:
        assert matcher.accept(token)
    return np.asarray(matcher.mask())


def words(mask: pb.Mask) -> np.ndarray:
    return np.frombuffer(mask.words, dtype="<i4").astype(np.int32)


@pytest_asyncio.fixture
async def service() -> AsyncIterator[Service]:
    with socket_dir() as directory:
        async with running_service(server_config(directory)) as running:
            yield running


@pytest_asyncio.fixture(params=["unix", "tcp"])
async def stub(service: Service, request: pytest.FixtureRequest) -> AsyncIterator[Stub]:
    address = service.addresses[0 if request.param == "unix" else 1]
    async with grpc.aio.insecure_channel(address) as channel:
        yield pb_grpc.ConstraintdStub(channel)


async def tiny_session(stub: Stub, grammar: str = AB_PLUS, **fields: Any) -> tuple[str, str]:
    vocab = await stub.RegisterVocab(tiny_registration())
    reply = await stub.CreateSession(
        pb.CreateSessionRequest(vocab_id=vocab.vocab_id, gbnf=pb.Gbnf(text=grammar), **fields)
    )
    return vocab.vocab_id, reply.session_id


async def status_and_message(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), caught.value.details() or ""


# -- the RPCs --------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_register_vocab_is_idempotent_and_content_addressed(stub: Stub) -> None:
    first = await stub.RegisterVocab(tiny_registration())
    again = await stub.RegisterVocab(tiny_registration())
    assert first == again
    assert first.size == len(TINY_PIECES)
    assert first.content_hash == Vocab(TINY_PIECES, TINY_EOG).content_hash == first.vocab_id


@pytest.mark.asyncio
async def test_register_vocab_from_a_gguf_path_equals_sending_its_pieces(stub: Stub) -> None:
    path = reference.require(reference.vocab_path("llama-spm"))
    by_path = await stub.RegisterVocab(pb.RegisterVocabRequest(gguf_path=str(path)))
    vocab = Vocab.from_gguf(path)
    assert by_path.size == 32000 and by_path.content_hash == vocab.content_hash
    rules = vocab.tokenizer
    assert rules is not None and vocab.token_texts is not None and vocab.token_attrs is not None
    listed = pb.PieceList(
        pieces=vocab.pieces,
        eog=sorted(vocab.eog_ids),
        token_texts=vocab.token_texts,
        token_attrs=vocab.token_attrs,
        tokenizer=pb.Tokenizer(
            model=rules.model,
            add_space_prefix=rules.add_space_prefix,
            escape_whitespaces=rules.escape_whitespaces,
        ),
    )
    by_pieces = await stub.RegisterVocab(pb.RegisterVocabRequest(pieces=listed))
    assert by_pieces == by_path


@pytest.mark.asyncio
async def test_accept_allows_and_mask(stub: Stub) -> None:
    _, session = await tiny_session(stub)
    start = await stub.Mask(pb.MaskRequest(session_id=session))
    assert np.array_equal(words(start.mask), engine_mask(AB_PLUS))
    assert start.mask.vocab_size == len(TINY_PIECES) and start.mask.allowed == 2  # "a" and "ab"
    assert start.state == pb.SessionState(complete=False, position=0)
    allows = await stub.Allows(pb.AllowsRequest(session_id=session, tokens=[A, B, AB, EOS]))
    assert list(allows.allowed) == [True, False, True, False]

    rejected = await stub.Accept(pb.AcceptRequest(session_id=session, token=B))
    assert not rejected.accepted and not rejected.HasField("mask")
    with_mask = await stub.Accept(pb.AcceptRequest(session_id=session, token=B, mask_on_reject=True))
    assert not with_mask.accepted and np.array_equal(words(with_mask.mask), engine_mask(AB_PLUS))
    accepted = await stub.Accept(pb.AcceptRequest(session_id=session, token=AB, mask_on_reject=True))
    assert accepted.accepted and not accepted.HasField("mask")
    assert accepted.state == pb.SessionState(complete=True, position=1)
    after = await stub.Mask(pb.MaskRequest(session_id=session))
    assert np.array_equal(words(after.mask), engine_mask(AB_PLUS, [AB]))
    eos = await stub.Accept(pb.AcceptRequest(session_id=session, token=EOS, position=1))
    assert eos.accepted and eos.state.position == 2


@pytest.mark.asyncio
async def test_mask_after_answers_the_mask_of_the_state_after_the_accept(stub: Stub) -> None:
    _, session = await tiny_session(stub)
    rejected = await stub.Accept(pb.AcceptRequest(session_id=session, token=B, mask_after=True))
    assert not rejected.accepted and np.array_equal(words(rejected.mask), engine_mask(AB_PLUS))
    taken = await stub.Accept(pb.AcceptRequest(session_id=session, token=A, mask_after=True, position=0))
    assert taken.accepted and np.array_equal(words(taken.mask), engine_mask(AB_PLUS, [A]))
    assert taken.mask.allowed == 1 and not taken.mask.all_allowed  # only "b"
    call = stub.Step()
    await call.write(
        pb.StepRequest(ops=[pb.StepOp(accept=pb.AcceptRequest(session_id=session, token=B, mask_after=True))])
    )
    answer = (await call.read()).results[0].accept
    assert answer.accepted and np.array_equal(words(answer.mask), engine_mask(AB_PLUS, [A, B]))
    call.cancel()


@pytest.mark.asyncio
async def test_mask_after_sends_a_mask_allowing_everything_as_a_flag(stub: Stub) -> None:
    # a lazy grammar before its trigger allows every token: the mask goes as `all_allowed`, no words
    _, session = await tiny_session(stub, options=pb.SessionOptions(trigger_tokens=[AB]))
    free = await stub.Accept(pb.AcceptRequest(session_id=session, token=B, mask_after=True))
    assert free.accepted and free.mask.all_allowed and free.mask.words == b""
    assert free.mask.allowed == free.mask.vocab_size == len(TINY_PIECES)
    # the plain Mask call keeps its words
    plain = await stub.Mask(pb.MaskRequest(session_id=session))
    assert not plain.mask.all_allowed and plain.mask.allowed == len(TINY_PIECES)
    assert len(plain.mask.words) == 4 * ((len(TINY_PIECES) + 31) // 32)
    triggered = await stub.Accept(pb.AcceptRequest(session_id=session, token=AB, mask_after=True))
    # the trigger's text is the grammar's first: "ab" then "b" or the end
    assert triggered.accepted and not triggered.mask.all_allowed
    assert np.array_equal(words(triggered.mask), engine_mask(AB_PLUS, [AB]))


@pytest.mark.asyncio
async def test_an_accept_batch_with_mask_after_answers_every_item_but_the_failed(stub: Stub) -> None:
    _, first = await tiny_session(stub)
    _, second = await tiny_session(stub)
    call = stub.Step()
    batch = pb.AcceptBatch(session_ids=[first, "nope", second], tokens=[A, A, B], mask_after=True)
    await call.write(pb.StepRequest(accepts=batch))
    answer = (await call.read()).accepts
    assert list(answer.accepted) == [True, False, False]
    assert [e.index for e in answer.errors] == [1]
    assert [m.index for m in answer.masks] == [0, 2]
    assert np.array_equal(words(answer.masks[0].mask), engine_mask(AB_PLUS, [A]))
    assert np.array_equal(words(answer.masks[1].mask), engine_mask(AB_PLUS))  # rejected: unchanged
    call.cancel()


@pytest.mark.asyncio
async def test_rollback_and_fork(stub: Stub) -> None:
    _, session = await tiny_session(stub)
    for token in (A, B, B):
        assert (await stub.Accept(pb.AcceptRequest(session_id=session, token=token))).accepted
    fork = await stub.Fork(pb.ForkRequest(session_id=session, position=3))
    assert fork.session_id != session and fork.state == pb.SessionState(complete=True, position=3)
    rolled = await stub.Rollback(pb.RollbackRequest(session_id=session, count=2, position=3))
    assert rolled.state == pb.SessionState(complete=False, position=1)
    # the fork went its own way
    assert (await stub.Accept(pb.AcceptRequest(session_id=fork.session_id, token=EOS))).accepted
    assert (await stub.Mask(pb.MaskRequest(session_id=session))).state.position == 1


@pytest.mark.asyncio
async def test_close_ends_a_session(stub: Stub) -> None:
    _, session = await tiny_session(stub)
    await stub.Close(pb.CloseRequest(session_id=session))
    code, message = await status_and_message(stub.Mask(pb.MaskRequest(session_id=session)))
    assert code is grpc.StatusCode.NOT_FOUND and "no open session" in message


@pytest.mark.asyncio
async def test_prefill_and_replay_at_creation(stub: Stub) -> None:
    options = pb.SessionOptions(prefill=b"a")
    _, session = await tiny_session(stub, options=options, replay=[B])
    mask = await stub.Mask(pb.MaskRequest(session_id=session))
    assert mask.state == pb.SessionState(complete=True, position=1)
    assert np.array_equal(words(mask.mask), engine_mask(AB_PLUS, [A, B]))


@pytest.mark.asyncio
async def test_a_long_replay_rebuilds_the_session(stub: Stub) -> None:
    history = [A] + [B] * 100  # more than the server replays on its event loop
    _, session = await tiny_session(stub, replay=history)
    mask = await stub.Mask(pb.MaskRequest(session_id=session))
    assert mask.state == pb.SessionState(complete=True, position=101)
    assert np.array_equal(words(mask.mask), engine_mask(AB_PLUS, history))
    vocab = await stub.RegisterVocab(tiny_registration())
    bad = pb.CreateSessionRequest(vocab_id=vocab.vocab_id, gbnf=pb.Gbnf(text=AB_PLUS), replay=[*history, A])
    code, message = await status_and_message(stub.CreateSession(bad))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert message == "the grammar rejects replayed token 3 at position 101"


CONSTRAINTS = {
    "gbnf": {"gbnf": pb.Gbnf(text='start ::= "{" "}"', root="start")},
    "json_schema": {"json_schema": json.dumps({"type": "string", "pattern": "x"})},
    "json_object": {"json_object": pb.JsonObject()},
    "openai": {"openai_request": json.dumps({"messages": [], "response_format": {"type": "json_object"}})},
    "ollama": {"ollama_request": json.dumps({"messages": [], "format": {"type": "string", "pattern": "x"}})},
}


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", list(CONSTRAINTS), ids=list(CONSTRAINTS))
async def test_every_kind_of_constraint_opens_a_session(stub: Stub, kind: str) -> None:
    vocab = await stub.RegisterVocab(tiny_registration())
    reply = await stub.CreateSession(pb.CreateSessionRequest(vocab_id=vocab.vocab_id, **CONSTRAINTS[kind]))
    assert reply.vocab_size == len(TINY_PIECES) and not reply.state.complete
    mask = await stub.Mask(pb.MaskRequest(session_id=reply.session_id))
    first = '"' if kind in ("json_schema", "ollama") else "{"
    assert mask.mask.allowed >= 1
    assert (
        await stub.Allows(
            pb.AllowsRequest(session_id=reply.session_id, tokens=[TINY_PIECES.index(first.encode())])
        )
    ).allowed[0]
    if kind in ("json_schema", "ollama"):
        assert list(reply.warnings) == [
            "pattern x is not supported (not anchored with '^' and '$'), accepting any string"
        ]


@pytest.mark.asyncio
async def test_a_lazy_grammar_waits_for_its_trigger(stub: Stub) -> None:
    _, session = await tiny_session(
        stub, grammar='root ::= "1" "2"', options=pb.SessionOptions(trigger_tokens=[8])
    )
    assert (await stub.Mask(pb.MaskRequest(session_id=session))).mask.allowed == len(TINY_PIECES)
    assert (await stub.Accept(pb.AcceptRequest(session_id=session, token=A))).accepted
    assert (await stub.Accept(pb.AcceptRequest(session_id=session, token=8))).accepted
    assert list((await stub.Allows(pb.AllowsRequest(session_id=session, tokens=[A, 9]))).allowed) == [
        False,
        True,
    ]


@pytest.mark.asyncio
async def test_step_answers_a_batch_in_order_with_errors_in_place(stub: Stub) -> None:
    _, first = await tiny_session(stub)
    _, second = await tiny_session(stub)
    call = stub.Step()
    await call.write(
        pb.StepRequest(
            ops=[
                pb.StepOp(accept=pb.AcceptRequest(session_id=first, token=A, position=0)),
                pb.StepOp(accept=pb.AcceptRequest(session_id=second, token=B, mask_on_reject=True)),
                pb.StepOp(mask=pb.MaskRequest(session_id=first)),
                pb.StepOp(allows=pb.AllowsRequest(session_id=second, tokens=[A, B])),
                pb.StepOp(accept=pb.AcceptRequest(session_id="nope", token=A)),
                pb.StepOp(accept=pb.AcceptRequest(session_id=first, token=B, position=0)),
                pb.StepOp(),
            ]
        )
    )
    reply = await call.read()
    kinds = [r.WhichOneof("result") for r in reply.results]
    assert kinds == ["accept", "accept", "mask", "allows", "error", "error", "error"]
    assert reply.results[0].accept.accepted
    assert not reply.results[1].accept.accepted
    assert np.array_equal(words(reply.results[1].accept.mask), engine_mask(AB_PLUS))
    assert np.array_equal(words(reply.results[2].mask.mask), engine_mask(AB_PLUS, [A]))
    assert list(reply.results[3].allows.allowed) == [True, False]
    assert reply.results[4].error.code == code_pb2.NOT_FOUND
    assert reply.results[5].error == status_for(
        PositionError(f"session {first} has accepted 1 tokens, not 0")
    )
    assert reply.results[6].error.code == code_pb2.INVALID_ARGUMENT
    # the stream goes on
    await call.write(pb.StepRequest(ops=[pb.StepOp(accept=pb.AcceptRequest(session_id=first, token=B))]))
    assert (await call.read()).results[0].accept.state == pb.SessionState(complete=True, position=2)
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await call.code() is grpc.StatusCode.OK


@pytest.mark.asyncio
async def test_a_mask_later_in_a_batch_sees_the_accepts_before_it(stub: Stub) -> None:
    _, session = await tiny_session(stub)
    call = stub.Step()
    await call.write(
        pb.StepRequest(
            ops=[
                pb.StepOp(mask=pb.MaskRequest(session_id=session)),
                pb.StepOp(accept=pb.AcceptRequest(session_id=session, token=A)),
                pb.StepOp(mask=pb.MaskRequest(session_id=session)),
            ]
        )
    )
    reply = await call.read()
    assert np.array_equal(words(reply.results[0].mask.mask), engine_mask(AB_PLUS))
    assert np.array_equal(words(reply.results[2].mask.mask), engine_mask(AB_PLUS, [A]))
    call.cancel()


@pytest.mark.asyncio
async def test_an_accept_batch_answers_in_columns_with_errors_and_masks_by_index(stub: Stub) -> None:
    _, first = await tiny_session(stub)
    _, second = await tiny_session(stub)
    _, third = await tiny_session(stub)
    call = stub.Step()
    batch = pb.AcceptBatch(
        session_ids=[first, second, "nope", third, first],
        tokens=[A, C_ACUTE_1, A, A, B],
        positions=[0, 0, 0, 1, 1],
        mask_on_reject=True,
    )
    await call.write(pb.StepRequest(ops=[pb.StepOp(mask=pb.MaskRequest(session_id=second))], accepts=batch))
    reply = await call.read()
    assert np.array_equal(words(reply.results[0].mask.mask), engine_mask(AB_PLUS))  # ops come first
    answer = reply.accepts
    # first takes A then B (items run in order); second rejects; "nope" is unknown; third is out of step
    assert list(answer.accepted) == [True, False, False, False, True]
    assert list(answer.complete) == [False, False, False, False, True]
    errors = [(e.index, e.error.code) for e in answer.errors]
    assert errors == [(2, code_pb2.NOT_FOUND), (3, code_pb2.ABORTED)]
    assert [m.index for m in answer.masks] == [1]
    assert np.array_equal(words(answer.masks[0].mask), engine_mask(AB_PLUS))
    # positions are optional; the stream goes on
    await call.write(pb.StepRequest(accepts=pb.AcceptBatch(session_ids=[third], tokens=[A])))
    assert list((await call.read()).accepts.accepted) == [True]
    call.cancel()


@pytest.mark.asyncio
async def test_an_accept_batch_with_ragged_columns_ends_the_stream(stub: Stub) -> None:
    _, session = await tiny_session(stub)
    call = stub.Step()
    await call.write(pb.StepRequest(accepts=pb.AcceptBatch(session_ids=[session, session], tokens=[A])))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "an accept batch of 2 sessions has 1 tokens and 0 positions" in (caught.value.details() or "")


# -- errors ----------------------------------------------------------------------------------------------

UNKNOWN = "not-a-session"
LONG_GRAMMAR = 'root ::= "' + "a" * 200 + '"'

# name -> (request builder (vocab id, session id) -> (method, request), status, text the message holds)
ERRORS: dict[str, tuple[Any, grpc.StatusCode, str]] = {
    "vocab-without-source": (
        lambda v, s: ("RegisterVocab", pb.RegisterVocabRequest()),
        grpc.StatusCode.INVALID_ARGUMENT,
        "RegisterVocab needs `pieces` or `gguf_path`",
    ),
    "vocab-empty": (
        lambda v, s: ("RegisterVocab", pb.RegisterVocabRequest(pieces=pb.PieceList())),
        grpc.StatusCode.INVALID_ARGUMENT,
        "at least one token",
    ),
    "vocab-eog-outside": (
        lambda v, s: ("RegisterVocab", pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=[b"a"], eog=[5]))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "outside the vocabulary",
    ),
    "vocab-missing-file": (
        lambda v, s: ("RegisterVocab", pb.RegisterVocabRequest(gguf_path="/nonexistent.gguf")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "cannot read GGUF file",
    ),
    "vocab-too-large": (
        lambda v, s: ("RegisterVocab", pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=[b"x"] * 100))),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "a vocabulary of 100 tokens is over the limit of 64",
    ),
    "session-without-constraint": (
        lambda v, s: ("CreateSession", pb.CreateSessionRequest(vocab_id=v)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "CreateSession needs a constraint",
    ),
    "session-unknown-vocab": (
        lambda v, s: ("CreateSession", pb.CreateSessionRequest(vocab_id="x", gbnf=pb.Gbnf(text=AB_PLUS))),
        grpc.StatusCode.NOT_FOUND,
        "unknown vocabulary 'x'",
    ),
    "session-bad-gbnf": (
        lambda v, s: (
            "CreateSession",
            pb.CreateSessionRequest(vocab_id=v, gbnf=pb.Gbnf(text='root ::= "a" |\nfoo ::= [')),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "at line 2, column",
    ),
    "session-undefined-rule": (
        lambda v, s: (
            "CreateSession",
            pb.CreateSessionRequest(vocab_id=v, gbnf=pb.Gbnf(text="root ::= missing")),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "missing",
    ),
    "session-bad-schema": (
        lambda v, s: (
            "CreateSession",
            pb.CreateSessionRequest(
                vocab_id=v, json_schema='{"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}'
            ),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "#/properties/a",
    ),
    "session-free-text-request": (
        lambda v, s: (
            "CreateSession",
            pb.CreateSessionRequest(vocab_id=v, openai_request='{"messages": []}'),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "asks for free text",
    ),
    "session-conflicting-request": (
        lambda v, s: (
            "CreateSession",
            pb.CreateSessionRequest(
                vocab_id=v, openai_request='{"grammar": "root ::= \\"a\\"", "json_schema": {}}'
            ),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "Cannot use both json_schema and grammar (at #/grammar)",
    ),
    "session-grammar-too-large": (
        lambda v, s: ("CreateSession", pb.CreateSessionRequest(vocab_id=v, gbnf=pb.Gbnf(text=LONG_GRAMMAR))),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "the gbnf is 211 bytes, over the limit of 128",
    ),
    "session-prefill-rejected": (
        lambda v, s: (
            "CreateSession",
            pb.CreateSessionRequest(
                vocab_id=v, gbnf=pb.Gbnf(text=AB_PLUS), options=pb.SessionOptions(prefill=b"b")
            ),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "the grammar rejects the prefill b'b'",
    ),
    "session-replay-rejected": (
        lambda v, s: (
            "CreateSession",
            pb.CreateSessionRequest(vocab_id=v, gbnf=pb.Gbnf(text=AB_PLUS), replay=[A, A]),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "the grammar rejects replayed token 3 at position 1",
    ),
    "session-bad-trigger-pattern": (
        lambda v, s: (
            "CreateSession",
            pb.CreateSessionRequest(
                vocab_id=v, gbnf=pb.Gbnf(text=AB_PLUS), options=pb.SessionOptions(trigger_patterns=["("])
            ),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid trigger pattern '('",
    ),
    "session-trigger-token-outside": (
        lambda v, s: (
            "CreateSession",
            pb.CreateSessionRequest(
                vocab_id=v, gbnf=pb.Gbnf(text=AB_PLUS), options=pb.SessionOptions(trigger_tokens=[3, 20])
            ),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "trigger token 20 is outside the vocabulary of 20",
    ),
    "accept-unknown-session": (
        lambda v, s: ("Accept", pb.AcceptRequest(session_id=UNKNOWN, token=A)),
        grpc.StatusCode.NOT_FOUND,
        f"no open session '{UNKNOWN}'",
    ),
    "accept-token-outside": (
        lambda v, s: ("Accept", pb.AcceptRequest(session_id=s, token=20)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "token 20 is outside the vocabulary of 20",
    ),
    "accept-negative-token": (
        lambda v, s: ("Accept", pb.AcceptRequest(session_id=s, token=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "token -1 is outside the vocabulary",
    ),
    "accept-wrong-position": (
        lambda v, s: ("Accept", pb.AcceptRequest(session_id=s, token=A, position=4)),
        grpc.StatusCode.ABORTED,
        "has accepted 0 tokens, not 4",
    ),
    "allows-token-outside": (
        lambda v, s: ("Allows", pb.AllowsRequest(session_id=s, tokens=[A, 99])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "token 99 is outside",
    ),
    "mask-unknown-session": (
        lambda v, s: ("Mask", pb.MaskRequest(session_id=UNKNOWN)),
        grpc.StatusCode.NOT_FOUND,
        "no open session",
    ),
    "rollback-too-far": (
        lambda v, s: ("Rollback", pb.RollbackRequest(session_id=s, count=1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "cannot roll back 1 tokens",
    ),
    "rollback-wrong-position": (
        lambda v, s: ("Rollback", pb.RollbackRequest(session_id=s, count=0, position=2)),
        grpc.StatusCode.ABORTED,
        "not 2",
    ),
    "fork-unknown-session": (
        lambda v, s: ("Fork", pb.ForkRequest(session_id=UNKNOWN)),
        grpc.StatusCode.NOT_FOUND,
        "no open session",
    ),
    "session-too-many-stacks": (
        lambda v, s: (
            "CreateSession",
            pb.CreateSessionRequest(
                vocab_id=v, gbnf=pb.Gbnf(text='root ::= x\nx ::= "a" | "b" | "1" | "2" | ":"')
            ),
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "the grammar starts with 5 stacks, above 4",
    ),
    "message-too-large": (
        lambda v, s: ("Allows", pb.AllowsRequest(session_id=s, tokens=[A] * 5000)),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "Received message larger than max",
    ),
    "close-unknown-session": (
        lambda v, s: ("Close", pb.CloseRequest(session_id=UNKNOWN)),
        grpc.StatusCode.NOT_FOUND,
        "no open session",
    ),
}


@pytest_asyncio.fixture
async def limited() -> AsyncIterator[Stub]:
    limits = dataclasses.replace(
        Limits(),
        max_vocab_size=64,
        max_grammar_bytes=128,
        max_sessions=3,
        max_stacks=4,
        max_request_bytes=4096,
    )
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory, limits=limits)) as running,
            grpc.aio.insecure_channel(running.addresses[0]) as channel,
        ):
            yield pb_grpc.ConstraintdStub(channel)


@pytest.mark.asyncio
@pytest.mark.parametrize("case", list(ERRORS), ids=list(ERRORS))
async def test_each_error_has_its_status_and_says_what(limited: Stub, case: str) -> None:
    build, status, text = ERRORS[case]
    vocab_id, session_id = await tiny_session(limited)
    method, request = build(vocab_id, session_id)
    code, message = await status_and_message(getattr(limited, method)(request))
    assert code is status
    assert text in message


@pytest.mark.asyncio
async def test_the_session_limit_is_resource_exhausted(limited: Stub) -> None:
    vocab_id, session_id = await tiny_session(limited)
    await tiny_session(limited)
    await limited.Fork(pb.ForkRequest(session_id=session_id))
    request = pb.CreateSessionRequest(vocab_id=vocab_id, gbnf=pb.Gbnf(text=AB_PLUS))
    code, message = await status_and_message(limited.CreateSession(request))
    assert (code, message) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "3 sessions are open, the limit")


@pytest.mark.asyncio
async def test_too_many_step_operations_end_the_stream() -> None:
    limits = dataclasses.replace(Limits(), max_step_ops=2)
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory, limits=limits)) as running,
            grpc.aio.insecure_channel(running.addresses[0]) as channel,
        ):
            stub = pb_grpc.ConstraintdStub(channel)
            _, session = await tiny_session(stub)
            for request in (
                pb.StepRequest(ops=[pb.StepOp(mask=pb.MaskRequest(session_id=session))] * 3),
                pb.StepRequest(
                    ops=[pb.StepOp(mask=pb.MaskRequest(session_id=session))],
                    accepts=pb.AcceptBatch(session_ids=[session] * 2, tokens=[A, B]),
                ),
            ):
                call = stub.Step()
                await call.write(request)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call.read()
                assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                details = caught.value.details() or ""
                assert "a Step message of 3 operations is over the limit of 2" in details


@pytest.mark.asyncio
async def test_a_compile_past_its_time_limit_is_deadline_exceeded() -> None:
    limits = dataclasses.replace(Limits(), compile_timeout=0.0)
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory, limits=limits)) as running,
            grpc.aio.insecure_channel(running.addresses[0]) as channel,
        ):
            stub = pb_grpc.ConstraintdStub(channel)
            code, message = await status_and_message(stub.RegisterVocab(tiny_registration()))
            assert code is grpc.StatusCode.DEADLINE_EXCEEDED
            assert message == "loading the vocabulary ran past its time limit of 0 s"


def prepare_slowly_when_asked(constraint: Constraint) -> PreparedGrammar:
    """`prepare`, except that a grammar saying "slowly" never ends: a compile stuck in its worker."""
    if "slowly" in constraint.text:
        time.sleep(3600)
    return prepare(constraint)


@pytest.mark.asyncio
async def test_a_compile_stuck_in_its_worker_process_is_deadline_exceeded_and_the_next_one_compiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry_module, "prepare", prepare_slowly_when_asked)
    limits = dataclasses.replace(Limits(), compile_timeout=1.0)
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory, limits=limits, compile_processes=1)) as running,
            grpc.aio.insecure_channel(running.addresses[0]) as channel,
        ):
            stub = pb_grpc.ConstraintdStub(channel)
            vocab = await stub.RegisterVocab(tiny_registration())
            await stub.CreateSession(
                pb.CreateSessionRequest(vocab_id=vocab.vocab_id, gbnf=pb.Gbnf(text=AB_PLUS))
            )
            assert running.compile_processes is not None
            (stuck,) = running.compile_processes.pids
            slow = pb.CreateSessionRequest(vocab_id=vocab.vocab_id, gbnf=pb.Gbnf(text='root ::= "slowly"'))
            code, message = await status_and_message(stub.CreateSession(slow))
            assert code is grpc.StatusCode.DEADLINE_EXCEEDED
            assert message == "compiling the constraint ran past its time limit of 1 s"
            after = pb.CreateSessionRequest(vocab_id=vocab.vocab_id, json_schema='{"type": "integer"}')
            assert (await stub.CreateSession(after)).session_id
            (replacement,) = running.compile_processes.pids
            assert replacement != stuck


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (GrammarError("bad", line=1, column=2), grpc.StatusCode.INVALID_ARGUMENT),
        (NotFoundError("gone"), grpc.StatusCode.NOT_FOUND),
        (ConstraintdError("base"), grpc.StatusCode.UNKNOWN),
        (KeyError("bug"), grpc.StatusCode.INTERNAL),
    ],
    ids=["grammar", "not-found", "base", "bug"],
)
def test_status_of_maps_each_error_by_its_class(error: Exception, code: grpc.StatusCode) -> None:
    status = status_of(error)
    assert status.code is code
    assert status.details == (
        str(error) if isinstance(error, ConstraintdError) else "internal error (logged by the server)"
    )
    ((key, value),) = status.trailing_metadata
    assert key == "grpc-status-details-bin"
    sent = status_pb2.Status.FromString(value)
    if isinstance(error, ConstraintdError):
        assert sent == status_for(error)
    else:  # a bug says nothing of itself
        assert sent == status_pb2.Status(code=code.value[0], message=status.details)


@pytest.mark.asyncio
async def test_a_refused_call_carries_its_error_as_details(stub: Stub) -> None:
    text = 'root ::= "a'
    with pytest.raises(GrammarError) as raised:
        Grammar.from_gbnf(text, Vocab(TINY_PIECES, TINY_EOG))
    engine = raised.value
    assert engine.line == 1 and engine.column > 1
    vocab = await stub.RegisterVocab(tiny_registration())
    call = stub.CreateSession(pb.CreateSessionRequest(vocab_id=vocab.vocab_id, gbnf=pb.Gbnf(text=text)))
    with pytest.raises(grpc.aio.AioRpcError):
        await call
    status = await rpc_status.aio.from_call(call)
    assert status is not None and status.code == code_pb2.INVALID_ARGUMENT
    assert status.message == await call.details() == str(engine)
    info, bad_request = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
    assert status.details[0].Unpack(info) and status.details[1].Unpack(bad_request)
    assert (info.reason, info.domain) == ("GrammarError", "constraintd")
    assert dict(info.metadata) == {
        "reason": engine.reason,
        "line": "1",
        "column": str(engine.column),
        "excerpt": engine.excerpt,
    }
    (violation,) = bad_request.field_violations
    assert violation.field == f"line 1, column {engine.column}"
    assert violation.description == engine.reason


# -- many sessions, and parity with the engine -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.asyncio
async def test_many_concurrent_sessions_each_keep_their_own_state(stub: Stub) -> None:
    vocab = await stub.RegisterVocab(tiny_registration())
    count = 200

    async def generation(seed: int) -> list[bool]:
        reply = await stub.CreateSession(
            pb.CreateSessionRequest(vocab_id=vocab.vocab_id, gbnf=pb.Gbnf(text=AB_PLUS))
        )
        session = reply.session_id
        length = 1 + seed % 7
        results = [(await stub.Accept(pb.AcceptRequest(session_id=session, token=A))).accepted]
        for _ in range(length):
            results.append((await stub.Accept(pb.AcceptRequest(session_id=session, token=B))).accepted)
        mask = await stub.Mask(pb.MaskRequest(session_id=session))
        assert mask.state.position == length + 1
        assert np.array_equal(words(mask.mask), engine_mask(AB_PLUS, [A] + [B] * length))
        await stub.Close(pb.CloseRequest(session_id=session))
        return results

    outcomes = await asyncio.gather(*(generation(seed) for seed in range(count)))
    assert all(all(results) for results in outcomes)


@pytest.mark.asyncio
async def test_masks_over_a_real_vocabulary_equal_the_engines(stub: Stub) -> None:
    """A seeded walk through a JSON-schema grammar over llama.cpp's llama-spm vocabulary (32,000 tokens):
    40 steps, each drawing a token from the server's mask; every mask equals the engine's own."""
    path = reference.require(reference.vocab_path("llama-spm"))
    schema = json.dumps(
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        }
    )
    vocab = await stub.RegisterVocab(pb.RegisterVocabRequest(gguf_path=str(path)))
    session = (
        await stub.CreateSession(pb.CreateSessionRequest(vocab_id=vocab.vocab_id, json_schema=schema))
    ).session_id
    from constraintd.engine.schema.convert import convert_json_schema

    local = Matcher(Grammar.from_gbnf(convert_json_schema(schema).grammar, Vocab.from_gguf(path)))
    rng = random.Random(1234)
    for _ in range(40):
        reply = await stub.Mask(pb.MaskRequest(session_id=session))
        mask = words(reply.mask)
        assert np.array_equal(mask, local.mask())
        allowed = np.flatnonzero(np.unpackbits(mask.astype("<i4").view(np.uint8), bitorder="little"))
        if allowed.size == 0 or reply.state.complete:
            break
        token = int(rng.choice(list(allowed)))
        assert (await stub.Accept(pb.AcceptRequest(session_id=session, token=token))).accepted
        assert local.accept(token)


@pytest.mark.asyncio
async def test_a_bug_is_internal_with_no_details_and_logged_with_its_traceback(
    service: Service, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(request: object, **options: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(service.operations, "mask_owing", broken)
    monkeypatch.setattr(service.operations, "step_slices", broken)
    async with grpc.aio.insecure_channel(service.addresses[0]) as channel:
        stub = pb_grpc.ConstraintdStub(channel)
        with caplog.at_level(logging.ERROR, logger="constraintd.server"):
            code, message = await status_and_message(stub.Mask(pb.MaskRequest(session_id="any")))
            assert (code, message) == (grpc.StatusCode.INTERNAL, "internal error (logged by the server)")
            call = stub.Step()
            await call.write(pb.StepRequest(ops=[pb.StepOp(mask=pb.MaskRequest(session_id="any"))]))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call.read()
            assert caught.value.code() is grpc.StatusCode.INTERNAL
    logged = [r for r in caplog.records if r.getMessage() == "internal error"]
    assert [getattr(r, "fields", {}).get("method") for r in logged] == ["Mask", "Step"]
    assert all(r.exc_info is not None and "a bug" in str(r.exc_info[1]) for r in logged)
