"""The service's life (constraintd/server/lifecycle.py) and what surrounds the RPCs: health, reflection,
metrics, idle reclamation, bearer tokens, TLS and mTLS, graceful shutdown and signals."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from constraintd.server.config import TlsFiles
from constraintd.server.lifecycle import EXIT_FORCED, Service, ServiceState, loop_factory
from constraintd.server.security import BearerTokenInterceptor
from constraintd.service.limits import Limits
from constraintd.v1 import constraintd_pb2 as pb
from constraintd.v1 import constraintd_pb2_grpc as pb_grpc
from tests.server.running import (
    AB_PLUS,
    TINY_EOG,
    TINY_PIECES,
    ServerProcess,
    running_service,
    server_config,
    socket_dir,
)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def registration() -> pb.RegisterVocabRequest:
    return pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=TINY_PIECES, eog=TINY_EOG))


async def open_session(stub: Any, **metadata: Any) -> str:
    vocab = await stub.RegisterVocab(registration(), **metadata)
    reply = await stub.CreateSession(
        pb.CreateSessionRequest(vocab_id=vocab.vocab_id, gbnf=pb.Gbnf(text=AB_PLUS)), **metadata
    )
    return str(reply.session_id)


@pytest_asyncio.fixture
async def service() -> AsyncIterator[Service]:
    with socket_dir() as directory:
        async with running_service(server_config(directory)) as running:
            yield running


@pytest.mark.asyncio
async def test_startup_binds_a_unix_socket_and_a_free_tcp_port(service: Service) -> None:
    unix, tcp = service.addresses
    assert unix.startswith("unix:///tmp/cd-") and unix.endswith("/constraintd.sock")
    host, port = tcp.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert service.state is ServiceState.SERVING
    for address in service.addresses:
        async with grpc.aio.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", "constraintd.v1.Constraintd"):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
                assert reply.status == SERVING


@pytest.mark.asyncio
async def test_an_address_that_cannot_be_bound_fails_startup() -> None:
    with socket_dir() as directory:
        config = server_config(directory, listen=(f"unix://{directory}/missing/dir/s.sock",))
        service = Service(config)
        with pytest.raises(Exception, match="cannot listen on unix://"):
            await service.startup()
        await service.shutdown()
        assert service.state is ServiceState.STOPPED


@pytest.mark.asyncio
async def test_reflection_lists_the_services_and_serves_the_descriptor(service: Service) -> None:
    async with grpc.aio.insecure_channel(service.addresses[0]) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo()
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        listed = await call.read()
        names = {s.name for s in listed.list_services_response.service}
        assert names == {
            "constraintd.v1.Constraintd",
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        }
        await call.write(
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="constraintd.v1.Constraintd")
        )
        files = (await call.read()).file_descriptor_response.file_descriptor_proto
        assert files and b"constraintd/v1/constraintd.proto" in files[0]
        await call.done_writing()


async def scrape(port: int, path: str = "/metrics") -> tuple[str, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    await writer.drain()
    response = (await reader.read()).decode()
    writer.close()
    head, _, body = response.partition("\r\n\r\n")
    return head.splitlines()[0], body


@pytest.mark.asyncio
async def test_metrics_count_calls_and_sessions(service: Service) -> None:
    async with grpc.aio.insecure_channel(service.addresses[0]) as channel:
        stub = pb_grpc.ConstraintdStub(channel)
        session = await open_session(stub)
        await stub.Accept(pb.AcceptRequest(session_id=session, token=3))
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Mask(pb.MaskRequest(session_id="nope"))
    assert service.metrics_port is not None
    status, body = await scrape(service.metrics_port)
    assert status == "HTTP/1.0 200 OK"
    lines = set(body.splitlines())
    assert 'constraintd_rpcs_total{method="Accept",code="OK"} 1' in lines
    assert 'constraintd_rpcs_total{method="Mask",code="NOT_FOUND"} 1' in lines
    assert "constraintd_sessions_open 1" in lines
    assert "constraintd_vocabularies 1" in lines
    assert "# TYPE constraintd_rpc_seconds histogram" in lines
    assert 'constraintd_rpc_seconds_count{method="Accept"} 1' in lines
    assert (await scrape(service.metrics_port, "/other"))[0] == "HTTP/1.0 404 Not Found"


@pytest.mark.asyncio
async def test_idle_sessions_are_reclaimed() -> None:
    now = [0.0]
    limits = dataclasses.replace(Limits(), default_ttl=30.0)
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory, limits=limits), clock=lambda: now[0]) as service,
            grpc.aio.insecure_channel(service.addresses[0]) as channel,
        ):
            stub = pb_grpc.ConstraintdStub(channel)
            idle = await open_session(stub)
            short = (
                await stub.CreateSession(
                    pb.CreateSessionRequest(
                        vocab_id=(await stub.RegisterVocab(registration())).vocab_id,
                        gbnf=pb.Gbnf(text=AB_PLUS),
                        options=pb.SessionOptions(ttl_seconds=5),
                    )
                )
            ).session_id
            now[0] = 10.0
            assert service.reclaim_idle() == 1  # the 5-second one
            busy = await open_session(stub)
            now[0] = 35.0
            await stub.Accept(pb.AcceptRequest(session_id=busy, token=3))  # used: lives on
            assert service.reclaim_idle() == 1  # the idle one
            assert len(service.store) == 1
            for gone in (idle, short):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Accept(pb.AcceptRequest(session_id=gone, token=3))
                assert caught.value.code() is grpc.StatusCode.NOT_FOUND
            assert service.metrics.sessions_reclaimed.value() == 2


@pytest.mark.asyncio
async def test_a_bearer_token_is_required_except_for_health() -> None:
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory, bearer_token="s3cret")) as service,
            grpc.aio.insecure_channel(service.addresses[0]) as channel,
        ):
            stub = pb_grpc.ConstraintdStub(channel)
            for metadata in (None, (("authorization", "Bearer wrong"),), (("authorization", "s3cret"),)):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.RegisterVocab(registration(), metadata=metadata)
                assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
                assert caught.value.details() == "missing or wrong bearer token"
            step = stub.Step()
            await step.write(pb.StepRequest())
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await step.read()
            assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
            session = await open_session(stub, metadata=(("authorization", "Bearer s3cret"),))
            assert session
            health = health_pb2_grpc.HealthStub(channel)
            assert (await health.Check(health_pb2.HealthCheckRequest())).status == SERVING


@pytest.mark.asyncio
async def test_a_call_without_the_token_is_refused_before_its_request_is_parsed() -> None:
    interceptor = BearerTokenInterceptor("s3cret")

    async def register(request: pb.RegisterVocabRequest, context: object) -> pb.RegisterVocabResponse:
        return pb.RegisterVocabResponse()

    served = grpc.unary_unary_rpc_method_handler(
        register, request_deserializer=pb.RegisterVocabRequest.FromString
    )

    async def continuation(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return served

    class Details(grpc.HandlerCallDetails):  # type: ignore[misc]
        def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
            self.method = "/constraintd.v1.Constraintd/RegisterVocab"
            self.invocation_metadata = metadata

    refused = await interceptor.intercept_service(continuation, Details(()))
    assert refused is not served and refused.request_deserializer is None
    token = (("authorization", "Bearer s3cret"),)
    assert await interceptor.intercept_service(continuation, Details(token)) is served


def make_certificates(directory: Path) -> dict[str, Path]:
    """A throwaway CA, a server certificate for localhost/127.0.0.1 and a client certificate (openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed: no certificates to test TLS with")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test-ca")
    (directory / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        run("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "1",
            "-extfile",
            "san.ext",
        )
    return {
        name: directory / name for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")
    }


@pytest.mark.asyncio
@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
async def test_tls_and_mutual_tls(tmp_path: Path, mutual: bool) -> None:
    files = make_certificates(tmp_path)
    tls = TlsFiles(files["server.pem"], files["server.key"], files["ca.pem"] if mutual else None)
    with socket_dir() as directory:
        config = server_config(directory, listen=("127.0.0.1:0",), tls=tls)
        async with running_service(config) as service:
            ca = files["ca.pem"].read_bytes()
            trusted = grpc.ssl_channel_credentials(
                ca, files["client.key"].read_bytes(), files["client.pem"].read_bytes()
            )
            async with grpc.aio.secure_channel(service.addresses[0], trusted) as channel:
                assert await open_session(pb_grpc.ConstraintdStub(channel))
            plain = grpc.ssl_channel_credentials(ca)
            async with grpc.aio.secure_channel(service.addresses[0], plain) as channel:
                call = pb_grpc.ConstraintdStub(channel).RegisterVocab(registration(), timeout=10)
                if mutual:
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await call
                    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
                else:
                    assert (await call).size == len(TINY_PIECES)
            async with grpc.aio.insecure_channel(service.addresses[0]) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await pb_grpc.ConstraintdStub(channel).RegisterVocab(registration(), timeout=10)
                assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


@pytest.mark.asyncio
async def test_shutdown_goes_not_serving_drains_in_flight_calls_then_releases() -> None:
    with socket_dir() as directory:
        service = Service(server_config(directory, shutdown_grace=60.0))
        await service.startup()
        async with grpc.aio.insecure_channel(service.addresses[0]) as channel:
            stub = pb_grpc.ConstraintdStub(channel)
            session = await open_session(stub)
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == SERVING
            step = stub.Step()
            accept_a = pb.StepRequest(ops=[pb.StepOp(accept=pb.AcceptRequest(session_id=session, token=3))])
            await step.write(accept_a)
            assert (await step.read()).results[0].accept.accepted

            shutdown = asyncio.create_task(service.shutdown())
            assert (await watch.read()).status == NOT_SERVING
            watch.cancel()  # a health watch is a call in flight too
            # the stream in flight keeps being answered while the server drains
            accept_b = pb.StepRequest(ops=[pb.StepOp(accept=pb.AcceptRequest(session_id=session, token=4))])
            await step.write(accept_b)
            assert (await step.read()).results[0].accept.state.complete
            # new calls are refused
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.RegisterVocab(registration())
            assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
            await step.done_writing()
            assert await step.read() is grpc.aio.EOF
            # the last call ended: shutdown finishes long before its 60-second grace
            await asyncio.wait_for(shutdown, timeout=30)
        assert service.state is ServiceState.STOPPED
        assert len(service.store) == 0


@pytest.mark.asyncio
async def test_shutdown_stops_the_compile_processes() -> None:
    with socket_dir() as directory:
        service = Service(server_config(directory, compile_processes=1))
        assert service.compile_processes is not None
        await service.startup()
        assert service.compile_processes.pids == []  # started on a first compile
        async with grpc.aio.insecure_channel(service.addresses[0]) as channel:
            await open_session(pb_grpc.ConstraintdStub(channel))
        (worker,) = service.compile_processes.pids
        await service.shutdown()
        assert service.compile_processes.pids == []
        with pytest.raises(ProcessLookupError):  # ended and reaped
            os.kill(worker, 0)


@pytest.mark.asyncio
async def test_without_compile_processes_compiles_run_in_the_threads() -> None:
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory, compile_processes=0)) as service,
            grpc.aio.insecure_channel(service.addresses[0]) as channel,
        ):
            assert service.compile_processes is None
            assert await open_session(pb_grpc.ConstraintdStub(channel))


@pytest.mark.asyncio
async def test_a_call_still_open_when_the_grace_ends_is_cancelled() -> None:
    with socket_dir() as directory:
        service = Service(server_config(directory, shutdown_grace=0.05))
        await service.startup()
        async with grpc.aio.insecure_channel(service.addresses[0]) as channel:
            step = pb_grpc.ConstraintdStub(channel).Step()
            await step.write(pb.StepRequest())
            await step.read()
            await service.shutdown()
            with pytest.raises(grpc.aio.AioRpcError):
                await step.read()
        assert service.state is ServiceState.STOPPED


def test_the_service_runs_on_uvloop() -> None:
    import uvloop

    assert loop_factory(True) is uvloop.new_event_loop
    assert loop_factory(False) is asyncio.new_event_loop

    async def life() -> str:
        with socket_dir() as directory:
            async with (
                running_service(server_config(directory, use_uvloop=True)) as service,
                grpc.aio.insecure_channel(service.addresses[0]) as channel,
            ):
                await open_session(pb_grpc.ConstraintdStub(channel))
                return type(asyncio.get_running_loop()).__module__

    with asyncio.Runner(loop_factory=loop_factory(True)) as runner:
        assert runner.run(life()).startswith("uvloop")


@pytest.mark.slow
def test_sigterm_shuts_the_process_down_cleanly() -> None:
    with socket_dir() as directory:
        server = ServerProcess(directory / "s.sock").start()
        try:
            server.signal(signal.SIGTERM)
            code, log = server.wait()
        finally:
            server.kill()
    assert code == 0, log
    assert "shutdown requested" in log and "stopped" in log


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_second_signal_exits_at_once() -> None:
    with socket_dir() as directory:
        server = ServerProcess(directory / "s.sock", "--grace", "600")
        await asyncio.to_thread(server.start)
        try:
            async with grpc.aio.insecure_channel(server.target) as channel:
                watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
                assert (await watch.read()).status == SERVING
                step = pb_grpc.ConstraintdStub(channel).Step()  # in flight: holds the graceful stop
                await step.write(pb.StepRequest())
                await step.read()
                server.signal(signal.SIGTERM)
                assert (await watch.read()).status == NOT_SERVING
                server.signal(signal.SIGTERM)
                code, log = await asyncio.to_thread(server.wait)
        finally:
            server.kill()
    assert code == EXIT_FORCED, log
    assert "second signal: exiting at once" in log
