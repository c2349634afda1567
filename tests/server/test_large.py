"""Requests too large to parse on the event loop (constraintd/server/large.py, servicer.py): parsed in
slices in a worker thread into exactly the message one parse makes, refused as one parse refuses."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf.message import DecodeError, Message

from clients.transports.grpc import vocab_parts
from constraintd.errors import DeadlineError, LimitError
from constraintd.server.large import PARSE_ON_LOOP, parse_in_slices
from constraintd.service.limits import Limits
from constraintd.v1 import constraintd_pb2 as pb
from constraintd.v1 import constraintd_pb2_grpc as pb_grpc
from tests.server.running import running_service, server_config, socket_dir

SLICES = (1, 3, 64, 1000)  # bytes a slice: a slice this small cuts everything that can be cut


def drawn_requests(rng: random.Random) -> list[Message]:
    def piece() -> bytes:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300 if rng.random() < 0.05 else 8)))

    def ints(high: int, most: int) -> list[int]:
        return [rng.randrange(0, high) for _ in range(rng.randrange(0, most))]

    vocab = pb.RegisterVocabRequest(
        pieces=pb.PieceList(
            pieces=[piece() for _ in range(rng.randrange(0, 2000))],
            eog=ints(1 << 31, 100),
            token_texts=["é" * rng.randrange(0, 4) for _ in range(rng.randrange(0, 300))],
            token_attrs=ints(1 << 32, 2000),
            tokenizer=pb.Tokenizer(model="gpt2", add_space_prefix=rng.random() < 0.5),
        )
    )
    allows = pb.AllowsRequest(session_id="s" * rng.randrange(0, 30), tokens=ints(1 << 31, 3000))
    session = pb.CreateSessionRequest(
        vocab_id="v",
        gbnf=pb.Gbnf(text="root ::= " + '"a" | ' * rng.randrange(0, 200) + '"b"'),
        options=pb.SessionOptions(
            trigger_patterns=["x" * rng.randrange(0, 40) for _ in range(rng.randrange(0, 5))],
            prefill=piece() * rng.randrange(0, 50),
        ),
        replay=ints(1 << 31, 3000),
    )
    step = pb.StepRequest(
        ops=[pb.StepOp(allows=pb.AllowsRequest(session_id="s", tokens=ints(1000, 300))) for _ in range(3)]
        + [pb.StepOp(accept=pb.AcceptRequest(session_id="t", token=5))],
        accepts=pb.AcceptBatch(session_ids=["a"] * 50, tokens=ints(1 << 31, 50), mask_on_reject=True),
    )
    return [vocab, allows, session, step]


def test_slices_make_the_message_one_parse_makes() -> None:
    rng = random.Random(3)
    for _ in range(60):
        for request in drawn_requests(rng):
            data = request.SerializeToString()
            for slice_bytes in SLICES:
                assert parse_in_slices(type(request), data, slice_bytes=slice_bytes) == request


def test_parts_make_the_message_their_concatenation_makes() -> None:
    rng = random.Random(4)
    for _ in range(30):
        for request in drawn_requests(rng):
            data = request.SerializeToString()
            cuts = sorted(rng.sample(range(len(data) + 1), min(3, len(data) + 1)))
            # parts cut at record boundaries are messages of their own: cut the fields apart
            parts = [type(request)(**{f.name: getattr(request, f.name)}) for f, _ in request.ListFields()]
            parts = [part.SerializeToString() for part in parts]
            assert parse_in_slices(type(request), parts, slice_bytes=64) == request
            merged = type(request)()
            for at, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
                if at < end:
                    try:
                        merged.MergeFromString(data[at:end])
                    except DecodeError:
                        break
            else:
                pieces = [data[at:end] for at, end in zip([0, *cuts], [*cuts, len(data)], strict=True)]
                assert parse_in_slices(type(request), pieces, slice_bytes=64) == merged


def test_the_records_of_all_parts_are_counted_together() -> None:
    name = pb.PieceList.DESCRIPTOR.fields_by_name["pieces"].full_name
    parts = [pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=[b"x"] * 600)).SerializeToString()] * 2

    def too_many() -> Exception:
        return LimitError("too many pieces")

    with pytest.raises(LimitError, match="too many pieces"):
        parse_in_slices(pb.RegisterVocabRequest, parts, most={name: (1000, too_many)})
    parsed = parse_in_slices(pb.RegisterVocabRequest, parts, most={name: (1200, too_many)})
    assert len(parsed.pieces.pieces) == 1200


def test_what_one_parse_refuses_is_refused() -> None:
    request = pb.AllowsRequest(session_id="s", tokens=list(range(5000)))
    data = request.SerializeToString()
    for broken in (data[:-1], data[:6], data + b"\x0f", data + b"\x80"):
        with pytest.raises(DecodeError):
            pb.AllowsRequest.FromString(broken)
        for slice_bytes in SLICES:
            with pytest.raises(DecodeError):
                parse_in_slices(pb.AllowsRequest, broken, slice_bytes=slice_bytes)


def test_a_walk_past_its_deadline_stops() -> None:
    data = pb.PieceList(pieces=[b"x"] * 10_000).SerializeToString()
    with pytest.raises(DeadlineError):
        parse_in_slices(pb.PieceList, data, deadline=time.monotonic() - 1.0)


def test_a_field_with_more_records_than_allowed_stops_the_walk_there() -> None:
    data = pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=[b"x"] * 10_000)).SerializeToString()
    name = pb.PieceList.DESCRIPTOR.fields_by_name["pieces"].full_name
    walked: list[int] = []

    def too_many() -> Exception:
        walked.append(1)
        return LimitError("too many pieces")

    with pytest.raises(LimitError, match="too many pieces"):
        parse_in_slices(pb.RegisterVocabRequest, data, slice_bytes=64, most={name: (1000, too_many)})
    assert walked == [1]
    full = parse_in_slices(pb.RegisterVocabRequest, data, most={name: (10_000, too_many)})
    assert len(full.pieces.pieces) == 10_000


@pytest.mark.parametrize("slice_bytes", [3, 64, 1 << 18])
def test_the_values_of_a_packed_field_are_counted_before_any_is_decoded(
    monkeypatch: pytest.MonkeyPatch, slice_bytes: int
) -> None:
    # ids of 1 to 5 bytes each: 30M ids in one packed record once took 470 MiB to decode into the message
    # before they were refused
    rng = random.Random(slice_bytes)
    ids = [rng.choice((1, 300, 70_000, 1 << 22, 1 << 30)) for _ in range(1001)]
    name = pb.AllowsRequest.DESCRIPTOR.fields_by_name["tokens"].full_name
    decoded: list[object] = []

    def too_many() -> Exception:
        return LimitError("too many ids")

    for request in (pb.AllowsRequest(session_id="s", tokens=t) for t in (ids[:1], ids)):
        data = request.SerializeToString()
        with monkeypatch.context() as patch:
            patch.setattr("constraintd.server.large.np.flatnonzero", lambda *a: decoded.append(a))
            with pytest.raises(LimitError, match="too many ids"):
                most = {name: (len(request.tokens) - 1, too_many)}
                parse_in_slices(pb.AllowsRequest, data, slice_bytes=slice_bytes, most=most)
        assert decoded == []  # refused before a packed record was cut into values
        most = {name: (len(request.tokens), too_many)}
        assert parse_in_slices(pb.AllowsRequest, data, slice_bytes=slice_bytes, most=most) == request


@pytest_asyncio.fixture
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    options = [("grpc.max_send_message_length", 64 << 20)]
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory)) as running,
            grpc.aio.insecure_channel(running.addresses[0], options=options) as channel,
        ):
            yield channel


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> Any:
    return pb_grpc.ConstraintdStub(channel)  # type: ignore[no-untyped-call]


@pytest.mark.asyncio
async def test_a_large_vocabulary_over_the_limit_is_refused_while_it_is_read() -> None:
    limits = dataclasses.replace(Limits(), max_vocab_size=1000)
    request = pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=[b"p%d" % i for i in range(300_000)]))
    assert request.ByteSize() > PARSE_ON_LOOP
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory, limits=limits)) as running,
            grpc.aio.insecure_channel(running.addresses[0]) as channel,
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await pb_grpc.ConstraintdStub(channel).RegisterVocab(request)  # type: ignore[no-untyped-call]
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert caught.value.details() == "a vocabulary of more than 1000 tokens is over the limit of 1000"


@pytest.mark.asyncio
async def test_a_large_request_is_answered_as_a_small_one(stub: Any) -> None:
    pieces = [b"</s>", *(b"p%d" % index for index in range(300_000))]
    request = pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=pieces, eog=[0]))
    assert request.ByteSize() > PARSE_ON_LOOP
    reply = await stub.RegisterVocab(request)
    assert reply.size == len(pieces)
    # the same vocabulary from a request small enough for the loop: the same content
    small = pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=pieces[:1000], eog=[0]))
    assert request.ByteSize() > PARSE_ON_LOOP > small.ByteSize()
    assert (await stub.RegisterVocab(small)).content_hash != reply.content_hash
    again = await stub.RegisterVocab(request)
    assert again.content_hash == reply.content_hash


@pytest.mark.asyncio
async def test_a_large_step_message_is_answered_as_a_small_one(stub: Any) -> None:
    pieces = [b"</s>", *(b"p%d" % index for index in range(20_000))]
    vocab = await stub.RegisterVocab(pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=pieces, eog=[0])))
    session = await stub.CreateSession(
        pb.CreateSessionRequest(vocab_id=vocab.vocab_id, gbnf=pb.Gbnf(text='root ::= "p" [0-4]+'))
    )
    rng = random.Random(5)
    tokens = [rng.randrange(1, len(pieces)) for _ in range(600_000)]

    def step(tokens: list[int]) -> pb.StepRequest:
        allows = pb.AllowsRequest(session_id=session.session_id, tokens=tokens)
        return pb.StepRequest(ops=[pb.StepOp(allows=allows)])

    assert step(tokens).ByteSize() > PARSE_ON_LOOP > step(tokens[:1000]).ByteSize()
    call = stub.Step()
    await call.write(step(tokens))
    large = await call.read()
    await call.write(step(tokens[:1000]))
    small = await call.read()
    await call.done_writing()
    allowed = list(large.results[0].allows.allowed)
    assert len(allowed) == len(tokens) and 0 < sum(allowed) < len(tokens)
    assert allowed[:1000] == list(small.results[0].allows.allowed)


@pytest.mark.asyncio
async def test_a_large_request_that_is_no_message_is_invalid(channel: grpc.aio.Channel) -> None:
    data = pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=[b"x" * 100] * 20_000)).SerializeToString()
    assert len(data) > PARSE_ON_LOOP
    raw = channel.unary_unary("/constraintd.v1.Constraintd/RegisterVocab")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await raw(data[:-1])
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid constraintd.v1.RegisterVocabRequest" in (caught.value.details() or "")


@pytest.mark.asyncio
async def test_a_vocabulary_in_parts_is_the_vocabulary_in_one_message(stub: Any) -> None:
    pieces = [b"</s>", *(b"p%d" % index for index in range(100_000))]
    texts = [piece.decode() for piece in pieces]
    request = pb.RegisterVocabRequest(
        pieces=pb.PieceList(
            pieces=pieces, eog=[0], token_texts=texts, token_attrs=[1] * len(pieces),
            tokenizer=pb.Tokenizer(model="gpt2"),
        )
    )
    parts = vocab_parts(request, part_bytes=64 << 10)
    assert len(parts) > 20 and max(part.ByteSize() for part in parts) < 70 << 10
    merged = pb.RegisterVocabRequest()
    for part in parts:
        merged.MergeFrom(part)
    assert merged == request
    whole = await stub.RegisterVocab(request)
    in_parts = await stub.RegisterVocabParts(iter(parts))
    assert (in_parts.vocab_id, in_parts.size, in_parts.content_hash) == (
        whole.vocab_id, len(pieces), whole.content_hash
    )


@pytest.mark.asyncio
async def test_a_vocabulary_in_parts_over_its_bytes_is_refused_as_it_comes() -> None:
    limits = dataclasses.replace(Limits(), max_vocab_bytes=1 << 20)
    part = pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=[b"p" * 100] * 3000))
    sent: list[int] = []

    def parts() -> Any:
        for index in range(100):  # 30 MB, were it all read
            sent.append(index)
            yield part

    with socket_dir() as directory:
        async with (
            running_service(server_config(directory, limits=limits)) as running,
            grpc.aio.insecure_channel(running.addresses[0]) as channel,
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await pb_grpc.ConstraintdStub(channel).RegisterVocabParts(parts())  # type: ignore[no-untyped-call]
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    expected = f"a vocabulary sent in parts over {1 << 20} bytes is over the limit of {1 << 20}"
    assert caught.value.details() == expected
    assert len(sent) < 100


@pytest.mark.asyncio
async def test_a_part_that_is_no_message_is_invalid(channel: grpc.aio.Channel) -> None:
    data = pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=[b"x" * 100] * 20)).SerializeToString()
    raw = channel.stream_unary("/constraintd.v1.Constraintd/RegisterVocabParts")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await raw(iter([data, data[:-1]]))
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid constraintd.v1.RegisterVocabRequest" in (caught.value.details() or "")


@pytest.mark.asyncio
async def test_a_request_over_the_message_limit_is_refused_before_it_is_read() -> None:
    limits = dataclasses.replace(Limits(), max_request_bytes=1 << 20)
    request = pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=[b"p%d" % i for i in range(200_000)]))
    assert request.ByteSize() > 1 << 20
    options = [("grpc.max_send_message_length", 64 << 20)]
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory, limits=limits)) as running,
            grpc.aio.insecure_channel(running.addresses[0], options=options) as channel,
        ):
            stub = pb_grpc.ConstraintdStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.RegisterVocab(request)
            assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "larger than max" in (caught.value.details() or "")
            # the same vocabulary in parts under the limit
            reply = await stub.RegisterVocabParts(iter(vocab_parts(request)))
            assert reply.size == 200_000
