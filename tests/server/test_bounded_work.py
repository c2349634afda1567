"""Every unit of work a client can size is bounded (service/limits.py, operations.py, registry.py): the
attacks that once held a real server's event loop for seconds (ten million token ids in one Allows, a
vocabulary with a 48 MiB piece) are refused before any work, RESOURCE_EXHAUSTED with the limit named; an
Allows of many tokens under the limit checks each distinct token once. The work is counted (calls into the
matcher, vocabularies built), never timed."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import pytest
import pytest_asyncio

from constraintd.engine.grammar.trigger_regex import Program
from constraintd.engine.matcher import Matcher
from constraintd.errors import DeadlineError, TokenError
from constraintd.service import registry as registry_module
from constraintd.service.constraints import Constraint, ConstraintKind
from constraintd.service.limits import Limits
from constraintd.service.operations import DISTINCT_CHECKS_FROM, OwedChecks
from constraintd.service.registry import Registry
from constraintd.v1 import constraintd_pb2 as pb
from constraintd.v1 import constraintd_pb2_grpc as pb_grpc
from tests.server.running import AB_PLUS, TINY_EOG, TINY_PIECES, running_service, server_config, socket_dir

Stub = Any
A = 3
LIMITS = dataclasses.replace(Limits(), max_tokens_per_call=1000, max_piece_bytes=1024)


@pytest_asyncio.fixture
async def stub() -> AsyncIterator[Stub]:
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory, limits=LIMITS)) as running,
            grpc.aio.insecure_channel(running.addresses[0]) as channel,
        ):
            yield pb_grpc.ConstraintdStub(channel)


@pytest.fixture
def allows_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    allows = Matcher.allows

    def counted(self: Matcher, token: int) -> bool:
        calls.append(token)
        return allows(self, token)

    monkeypatch.setattr(Matcher, "allows", counted)
    return calls


async def session(stub: Stub, **fields: Any) -> tuple[str, str]:
    vocab = await stub.RegisterVocab(
        pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=TINY_PIECES, eog=TINY_EOG))
    )
    reply = await stub.CreateSession(
        pb.CreateSessionRequest(vocab_id=vocab.vocab_id, gbnf=pb.Gbnf(text=AB_PLUS), **fields)
    )
    return vocab.vocab_id, reply.session_id


async def refusal(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), caught.value.details() or ""


@pytest.mark.asyncio
async def test_an_allows_of_too_many_tokens_is_refused_before_any_is_checked(
    stub: Stub, allows_calls: list[int]
) -> None:
    _, session_id = await session(stub)
    reply = await stub.Allows(pb.AllowsRequest(session_id=session_id, tokens=[A] * 1000))
    assert len(reply.allowed) == len(allows_calls) == 1000
    allows_calls.clear()
    code, message = await refusal(
        stub.Allows(pb.AllowsRequest(session_id=session_id, tokens=[A] * 1_000_000))
    )
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "over the limit of 1000 token ids a call" in message  # counted as the request is read
    assert allows_calls == []


@pytest.mark.asyncio
async def test_a_step_counts_the_tokens_of_all_its_allows(stub: Stub, allows_calls: list[int]) -> None:
    _, session_id = await session(stub)
    op = pb.StepOp(allows=pb.AllowsRequest(session_id=session_id, tokens=[A] * 600))
    call = stub.Step()
    await call.write(pb.StepRequest(ops=[op, op]))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "1200 tokens to check in a Step message are over the limit of 1000" in (
        caught.value.details() or ""
    )
    assert allows_calls == []


@pytest.mark.parametrize(
    ("fields", "what"),
    [
        ({"replay": [A] * 1001}, "1001 replayed tokens"),
        ({"options": pb.SessionOptions(trigger_tokens=[A] * 1001)}, "1001 trigger tokens"),
    ],
    ids=["replay", "trigger-tokens"],
)
@pytest.mark.asyncio
async def test_a_session_asking_for_too_many_tokens_is_refused(
    stub: Stub, fields: dict[str, Any], what: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    vocab_id, _ = await session(stub)
    accepts: list[int] = []
    accept = Matcher.accept
    monkeypatch.setattr(Matcher, "accept", lambda self, token: accepts.append(token) or accept(self, token))
    request = pb.CreateSessionRequest(vocab_id=vocab_id, gbnf=pb.Gbnf(text=AB_PLUS), **fields)
    code, message = await refusal(stub.CreateSession(request))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"{what} are over the limit of 1000 token ids a call" in message
    assert accepts == []


@pytest.mark.parametrize(
    "attack",
    [
        lambda big: pb.PieceList(pieces=[*TINY_PIECES, big], eog=TINY_EOG),
        lambda big: pb.PieceList(
            pieces=[*TINY_PIECES, b"<x>"],
            eog=TINY_EOG,
            token_texts=[""] * len(TINY_PIECES) + [big.decode()],
        ),
    ],
    ids=["piece", "token-text"],
)
@pytest.mark.asyncio
async def test_a_vocabulary_with_a_huge_piece_is_refused_before_it_is_built(
    stub: Stub, attack: Callable[[bytes], pb.PieceList], monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[int] = []
    vocab = registry_module.Vocab

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return vocab(*args, **kwargs)

    monkeypatch.setattr(registry_module, "Vocab", counted)
    code, message = await refusal(
        stub.RegisterVocab(pb.RegisterVocabRequest(pieces=attack(b"x" * (3 << 20))))
    )
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"of token {len(TINY_PIECES)} is {3 << 20} bytes, over the limit of 1024 bytes a piece" in message
    assert built == []
    # a piece at the limit is a vocabulary
    reply = await stub.RegisterVocab(
        pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=[*TINY_PIECES, b"x" * 1024], eog=TINY_EOG))
    )
    assert reply.size == len(TINY_PIECES) + 1


@pytest.mark.parametrize(
    ("patterns", "message"),
    [
        (["x" * (1 << 20)], f"the gbnf and its trigger patterns ({1 << 20} bytes) are over the limit of"),
        ([f"x{i}+" for i in range(65)],
         "65 trigger patterns that are not literal words are over the limit of 64"),
    ],
    ids=["size", "count"],
)
@pytest.mark.asyncio
async def test_trigger_patterns_count_in_the_grammar_size(
    stub: Stub, patterns: list[str], message: str
) -> None:
    vocab_id, _ = await session(stub)
    options = pb.SessionOptions(trigger_patterns=patterns)
    request = pb.CreateSessionRequest(vocab_id=vocab_id, gbnf=pb.Gbnf(text=AB_PLUS), options=options)
    code, details = await refusal(stub.CreateSession(request))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert message in details


@pytest.mark.asyncio
async def test_trigger_words_count_in_bytes_not_in_patterns(stub: Stub) -> None:
    # a thousand tool names as trigger words (one automaton): taken, and the grammar waits for them
    words = [f"<function=tool_{i}>" for i in range(1000)]
    _, session_id = await session(stub, options=pb.SessionOptions(trigger_patterns=words))
    assert session_id


@pytest.mark.asyncio
async def test_a_backtracking_trigger_pattern_costs_each_accept_the_same(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (a+a+)+y once made every Accept twice as slow as the one before (the 26th took 8 s, all sessions
    # waited); the patterns now run as automata that read each new byte once: count their steps
    steps: list[int] = []
    closure = Program._closure

    def counted(self: Program, *args: Any) -> Any:
        steps[-1] += 1
        return closure(self, *args)

    monkeypatch.setattr(Program, "_closure", counted)
    options = pb.SessionOptions(trigger_patterns=["(a+a+)+y"])
    _, session_id = await session(stub, options=options)
    for _ in range(200):
        steps.append(0)
        reply = await stub.Accept(pb.AcceptRequest(session_id=session_id, token=A))
        assert reply.accepted
    assert max(steps) == steps[-1] <= 4


# -- Allows' owed checks, on a matcher (constraintd/service/operations.py) ------------------------------

BYTES = [b"</s>", *(bytes((b,)) for b in range(1, 256))]


@pytest.fixture
def matcher() -> Matcher:
    registry = Registry(Limits())
    vocab = registry.register_pieces(BYTES, [0])
    compiled = registry.compile(Constraint(ConstraintKind.JSON_OBJECT, ""), vocab)
    matcher = Matcher(compiled.grammar, max_stacks=Limits().max_stacks)
    assert matcher.accept_bytes(b'{"a": [1, "x')  # inside a string inside an array: some bytes end it
    return matcher


def checked(matcher: Matcher, tokens: Sequence[int], deadline: float | None = None) -> list[bool]:
    reply = pb.AllowsResponse()
    OwedChecks(reply, matcher.fork(), tokens).pay(deadline)
    return list(reply.allowed)


@pytest.mark.parametrize("given", ["list", "request field"])
def test_many_tokens_answer_what_each_checked_in_order_answers(
    matcher: Matcher, allows_calls: list[int], given: str
) -> None:
    # an Allows of many tokens checks each distinct one once (OwedChecks): its work is bounded by the
    # vocabulary, not by how often a token is repeated; the ids come as a list (the in-process client) or
    # as a parsed request's repeated field (the server), which numpy reads in one call
    rng = random.Random(7)
    tokens = [rng.randrange(len(BYTES)) for _ in range(4 * DISTINCT_CHECKS_FROM)]
    expected = [matcher.allows(token) for token in tokens]
    assert 0 < sum(expected) < len(expected)
    calls = allows_calls
    calls.clear()
    parsed = pb.AllowsRequest.FromString(pb.AllowsRequest(tokens=tokens).SerializeToString())
    asked = tokens if given == "list" else parsed.tokens
    assert checked(matcher, asked) == expected
    assert len(calls) == len(set(tokens))  # each distinct token once
    calls.clear()
    few = tokens[:DISTINCT_CHECKS_FROM]  # not many: checked one by one, in order
    assert checked(matcher, few) == expected[:DISTINCT_CHECKS_FROM] and calls == few


def test_a_token_outside_the_vocabulary_among_many_is_refused(matcher: Matcher) -> None:
    tokens = [1] * DISTINCT_CHECKS_FROM + [len(BYTES)] + [2] * 10
    with pytest.raises(TokenError):
        checked(matcher, tokens)


def test_many_checks_past_their_deadline_stop(matcher: Matcher) -> None:
    with pytest.raises(DeadlineError):
        checked(matcher, [1] * (2 * DISTINCT_CHECKS_FROM), deadline=time.monotonic() - 1.0)
