# Transports: where a client's calls go. One request message in, its reply out; a failure is raised as the
# `ConstraintdError` its status maps to (clients/status.py), so nothing grpc escapes a transport.
#
# gRPC (`GrpcTransport`, `AsyncGrpcTransport`): one RPC per call over grpc's blocking channel or grpc.aio's,
# except the async transport's Accept, which goes as a Step of one accept on the open Step stream (a message
# on an open stream costs grpc.aio about half a unary call's round trip); its reply and its errors are the
# unary call's.
# - Calls wait for the channel to be ready (up to their deadline) instead of failing at once while the
#   server restarts, and the channel reconnects quickly (100 ms first backoff): a client riding out a
#   server restart sees a slower call, then NOT_FOUND for its sessions, which the flows rebuild.
# - The async transport keeps one Step stream open and pipelines batches on it: a batch is written as soon
#   as the one before it is written, and one reader task hands the replies, which come in the order of
#   the batches, to their callers in turn. So a worker with two groups of sequences keeps the server busy
#   with one while it reads the other's answer. A stream that fails, ends or times out is dropped with
#   every batch still waiting on it (they fail UNAVAILABLE, so the flows retry them; their positions keep
#   a retry from applying a token twice), and the next batch opens a new one. The sync transport opens a
#   stream per batch (grpc's blocking API has no cheaper way to pair a write and a read).
#
# In-process (`LocalTransport`, `AsyncLocalTransport`): the service's own operations, called directly.
# - It answers exactly as a server would: the same `Operations` (decode, engine, encode) over its own
#   registry and session store, the same messages in and out, the same errors (raised as the engine's
#   `ConstraintdError`s, so a GBNF error keeps its class, line and column).
# - Compiles run inline, on the caller's thread (or event loop): in-process means no worker pool. The
#   async flavour is a real coroutine around the same calls; it awaits nothing because nothing here waits.
from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from clients.base import ClientTls
from clients.status import error_for
from constraintd.errors import ConstraintdError, DeadlineError, UnavailableError
from constraintd.server.config import Limits
from constraintd.server.operations import Operations
from constraintd.server.registry import Registry
from constraintd.server.sessions import SessionStore
from constraintd.v1 import constraintd_pb2 as pb
from constraintd.v1 import constraintd_pb2_grpc as pb_grpc

__all__ = ["MIB", "AsyncGrpcTransport", "AsyncLocalTransport", "GrpcTransport", "LocalTransport"]

MIB = 1 << 20


def _options(tls: ClientTls | None, max_message_bytes: int) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]
    if tls is not None and tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return options


def _credentials(tls: ClientTls) -> grpc.ChannelCredentials:
    def read(path: Any) -> bytes | None:
        return path.read_bytes() if path is not None else None

    return grpc.ssl_channel_credentials(read(tls.ca), read(tls.key), read(tls.cert))


def _metadata(token: str | None) -> Sequence[tuple[str, str]] | None:
    return (("authorization", f"Bearer {token}"),) if token else None


def _failure(error: grpc.RpcError) -> ConstraintdError:
    return error_for(error.code().name, error.details() or "")


class GrpcTransport:
    """Blocking calls over a `grpc.Channel`."""

    def __init__(
        self,
        target: str,
        *,
        tls: ClientTls | None = None,
        token: str | None = None,
        max_message_bytes: int = 64 * MIB,
    ) -> None:
        options = _options(tls, max_message_bytes)
        if tls is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(target, _credentials(tls), options=options)
        self._stub = pb_grpc.ConstraintdStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = _metadata(token)

    def call(self, method: str, request: Any, *, timeout: float | None) -> Any:
        try:
            if method == "Step":
                replies = self._stub.Step(
                    iter((request,)), timeout=timeout, metadata=self._metadata, wait_for_ready=True
                )
                return next(replies)
            return getattr(self._stub, method)(
                request, timeout=timeout, metadata=self._metadata, wait_for_ready=True
            )
        except grpc.RpcError as error:
            raise _failure(error) from None

    def close(self) -> None:
        self._channel.close()


class AsyncGrpcTransport:
    """Awaited calls over a `grpc.aio.Channel`; Step batches over one long-lived stream."""

    def __init__(
        self,
        target: str,
        *,
        tls: ClientTls | None = None,
        token: str | None = None,
        max_message_bytes: int = 64 * MIB,
    ) -> None:
        options = _options(tls, max_message_bytes)
        if tls is None:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        else:
            self._channel = grpc.aio.secure_channel(target, _credentials(tls), options=options)
        self._stub = pb_grpc.ConstraintdStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = _metadata(token)
        self._stream: Any = None
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._reader: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()

    async def call(self, method: str, request: Any, *, timeout: float | None) -> Any:
        if method == "Step":
            return await self._step(request, timeout)
        if method == "Accept":  # the hot path: a message on the open stream costs less than a unary call
            reply = await self._step(pb.StepRequest(ops=[pb.StepOp(accept=request)]), timeout)
            return _only_accept(reply)
        try:
            return await getattr(self._stub, method)(
                request, timeout=timeout, metadata=self._metadata, wait_for_ready=True
            )
        except grpc.RpcError as error:
            raise _failure(error) from None

    async def _step(self, request: Any, timeout: float | None) -> Any:
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        async with self._write_lock:  # writes go one at a time, in the order replies will come
            if self._stream is None:
                self._stream = self._stub.Step(metadata=self._metadata, wait_for_ready=True)
                self._reader = asyncio.create_task(self._read(self._stream, self._waiting))
            stream = self._stream
            self._waiting.append(reply)
            try:
                await stream.write(request)
            except grpc.RpcError as error:
                self._drop_stream(_failure(error))
            except asyncio.InvalidStateError:  # the stream had ended since the last batch
                self._drop_stream(UnavailableError("the Step stream had ended"))
        try:
            return await asyncio.wait_for(reply, timeout)
        except TimeoutError:
            if self._stream is stream:
                self._drop_stream(UnavailableError("an earlier Step batch timed out"))
            raise DeadlineError(f"no Step reply within {timeout} s") from None

    async def _read(self, stream: Any, waiting: collections.deque[asyncio.Future[Any]]) -> None:
        """Hands each reply of `stream` to the batch waiting longest, until the stream ends or fails; then
        fails the batches still waiting, and lets the next batch open a new stream."""
        try:
            while (reply := await stream.read()) is not grpc.aio.EOF:
                if waiting:
                    answered = waiting.popleft()
                    if not answered.done():  # its caller may have given up (a timeout, a cancel)
                        answered.set_result(reply)
            failure: ConstraintdError = UnavailableError("the Step stream ended")
        except grpc.RpcError as error:
            failure = _failure(error)
        except asyncio.InvalidStateError:
            failure = UnavailableError("the Step stream had ended")
        if self._stream is stream:
            self._stream = None
            self._reader = None
        _fail_all(waiting, failure)

    def _drop_stream(self, failure: ConstraintdError) -> None:
        """Drops the stream; every batch still waiting on it fails with `failure`."""
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        _fail_all(self._waiting, failure)
        self._waiting = collections.deque()

    async def close(self) -> None:
        self._drop_stream(UnavailableError("the client is closed"))
        await self._channel.close()


def _only_accept(reply: pb.StepReply) -> pb.AcceptReply:
    """The AcceptReply of a Step of one accept, or the error it answered, raised."""
    if len(reply.results) != 1:
        raise UnavailableError("the Step reply does not answer its one accept")
    result = reply.results[0]
    if result.WhichOneof("result") == "error":
        raise error_for(result.error.status, result.error.message)
    return result.accept


def _fail_all(waiting: collections.deque[asyncio.Future[Any]], failure: ConstraintdError) -> None:
    while waiting:
        answered = waiting.popleft()
        if not answered.done():
            answered.set_exception(failure)


class LocalTransport:
    """The engine in this process, behind the service's operations."""

    def __init__(self, limits: Limits | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        limits = limits or Limits()
        self.operations = Operations(Registry(limits), SessionStore(limits, clock=clock), limits)
        ops = self.operations
        self._methods: dict[str, Callable[[Any], Any]] = {
            "RegisterVocab": ops.register_vocab,
            "CreateSession": ops.create_session,
            "Accept": ops.accept,
            "Allows": ops.allows,
            "Mask": ops.mask,
            "Rollback": ops.rollback,
            "Fork": ops.fork,
            "Close": ops.close,
            "Step": ops.step,
        }

    def call(self, method: str, request: Any, *, timeout: float | None) -> Any:
        """Answers one request; `timeout` is ignored (nothing here waits)."""
        return self._methods[method](request)

    def close(self) -> None:
        self.operations.store.release_all()


class AsyncLocalTransport:
    """`LocalTransport` for `AsyncClient`."""

    def __init__(self, limits: Limits | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._local = LocalTransport(limits, clock=clock)
        self.operations = self._local.operations

    async def call(self, method: str, request: Any, *, timeout: float | None) -> Any:
        return self._local.call(method, request, timeout=timeout)

    async def close(self) -> None:
        self._local.close()
