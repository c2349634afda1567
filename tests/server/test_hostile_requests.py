"""Hostile requests against a real server, answered cleanly and counted (server/servicer.py, security.py,
metrics.py, service/limits.py): a megabyte of session id is not echoed back, bytes that are not the
method's message are INVALID_ARGUMENT, a metrics request line past 64 KiB gets 431 and a closed connection
(no traceback in the log), and refusals, undecodable requests and errors inside a Step reply all show in
the metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio

from constraintd.server.lifecycle import Service
from constraintd.service.limits import ECHO_CHARS
from constraintd.v1 import constraintd_pb2 as pb
from constraintd.v1 import constraintd_pb2_grpc as pb_grpc
from tests.server.running import running_service, server_config, socket_dir

Stub = Any
HUGE_ID = "x" * (1 << 20)
GARBAGE = b"\xff\xff\xff\xff"  # an incomplete field tag: no message decodes from it


@pytest_asyncio.fixture
async def service() -> AsyncIterator[Service]:
    with socket_dir() as directory:
        async with running_service(server_config(directory)) as running:
            yield running


@pytest_asyncio.fixture
async def channel(service: Service) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(service.addresses[0]) as opened:
        yield opened


@pytest.mark.asyncio
async def test_a_megabyte_session_id_is_not_echoed(service: Service, channel: grpc.aio.Channel) -> None:
    stub = pb_grpc.ConstraintdStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Accept(pb.AcceptRequest(session_id=HUGE_ID, token=1))
    assert raised.value.code() is grpc.StatusCode.NOT_FOUND
    details = raised.value.details() or ""
    assert f"no open session {'x' * ECHO_CHARS!r}... (closed" in details and len(details) < 200
    call = stub.Step()
    await call.write(pb.StepRequest(ops=[pb.StepOp(mask=pb.MaskRequest(session_id=HUGE_ID))]))
    reply = await call.read()
    await call.done_writing()
    assert len(reply.results[0].error.message) < 200


@pytest.mark.asyncio
@pytest.mark.parametrize("method", ["Accept", "RegisterVocab", "Step"])
async def test_bytes_that_are_not_the_message_are_invalid_argument(
    service: Service, channel: grpc.aio.Channel, method: str
) -> None:
    path = f"/constraintd.v1.Constraintd/{method}"
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        if method == "Step":
            call = channel.stream_stream(path)()
            await call.write(GARBAGE)
            await call.read()
        else:
            await channel.unary_unary(path)(GARBAGE)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    request_type = "StepRequest" if method == "Step" else f"{method}Request"
    assert raised.value.details() == f"the request is not a valid constraintd.v1.{request_type} message"
    assert service.metrics.rpcs.value(method, "INVALID_ARGUMENT") == 1


@pytest.mark.asyncio
async def test_errors_inside_a_step_reply_are_counted(service: Service, channel: grpc.aio.Channel) -> None:
    call = pb_grpc.ConstraintdStub(channel).Step()
    await call.write(
        pb.StepRequest(
            ops=[pb.StepOp(accept=pb.AcceptRequest(session_id="gone", token=1)), pb.StepOp()],
            accepts=pb.AcceptBatch(session_ids=["gone", "also-gone"], tokens=[1, 2]),
        )
    )
    reply = await call.read()
    await call.done_writing()
    assert len(reply.accepts.errors) == 2
    errors = service.metrics.step_errors
    assert errors.value("accept", "NOT_FOUND") == 3 and errors.value("none", "INVALID_ARGUMENT") == 1
    asked = service.metrics.step_ops
    assert asked.value("accept") == 3 and asked.value("none") == 1
    assert 'constraintd_step_errors_total{op="accept",code="NOT_FOUND"} 3' in service.metrics.render()


@pytest.mark.asyncio
async def test_unauthenticated_calls_are_counted() -> None:
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory, bearer_token="s3cret")) as service,
            grpc.aio.insecure_channel(service.addresses[0]) as channel,
        ):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await pb_grpc.ConstraintdStub(channel).Close(pb.CloseRequest(session_id="s"))
            assert raised.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert service.metrics.rpcs.value("Close", "UNAUTHENTICATED") == 1


@pytest.mark.asyncio
async def test_a_metrics_request_line_past_64_kib_gets_431(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    assert service.metrics_port is not None
    caplog.set_level(logging.DEBUG)
    reader, writer = await asyncio.open_connection("127.0.0.1", service.metrics_port)
    writer.write(b"GET /" + b"a" * (70 * 1024) + b" HTTP/1.0\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)  # to the end: the server closed the connection
    writer.close()
    assert answer.startswith(b"HTTP/1.0 431 ")
    assert not [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]
