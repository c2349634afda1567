# The gRPC transports: a failure is raised as the `ConstraintdError` its status maps to (clients/status.py),
# so nothing grpc escapes them. A failed call's google.rpc.Status (grpcio-status reads it from the trailing
# metadata) and a failed Step operation's come back as the server's own error class, with its message
# and parts: the same error the in-process transport raises.
#
# gRPC (`GrpcTransport`, `AsyncGrpcTransport`): one RPC per call over grpc's blocking channel or grpc.aio's,
# except Accept, which goes as a Step of one accept on a Step stream kept open (a message on an open stream
# costs grpc about half to two thirds of a unary call's round trip); its reply, errors and deadline are the
# unary call's. A RegisterVocab over VOCAB_PART_BYTES goes as RegisterVocabParts, in parts of about that
# (a server takes requests of 4 MiB by default, a 262k-token vocabulary is about 5.4 MiB, and gathering a
# part costs the server's event loop about a millisecond a MiB).
# - Calls wait for the channel to be ready (up to their deadline) instead of failing at once while the
#   server restarts, and the channel reconnects quickly (100 ms first backoff): a client riding out a
#   server restart sees a slower call, then NOT_FOUND for its sessions, which the flows rebuild.
# - The async transport keeps one Step stream open and pipelines batches on it: a batch is written as soon
#   as the one before it is written, and one reader task hands the replies, which come in the order of
#   the batches, to their callers in turn. So a worker with two groups of sequences keeps the server busy
#   with one while it reads the other's answer. A stream that fails, ends or times out is dropped with
#   every batch still waiting on it (they fail UNAVAILABLE, so the flows retry them; their positions keep
#   a retry from applying a token twice), and the next batch opens a new one. The sync transport keeps
#   one stream open for Accepts and Step batches, one message at a time (a thread that finds it busy makes
#   its call on a call of its own); a stream that fails or passes a deadline is dropped, and the next call
#   opens another.
#
from __future__ import annotations

import asyncio
import collections
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
from google.rpc import status_pb2
from grpc_status import rpc_status

from clients.base import ClientTls
from clients.status import error_for, error_from
from clients.transports.base import MIB
from constraintd.errors import ConstraintdError, DeadlineError, UnavailableError
from constraintd.v1 import constraintd_pb2 as pb
from constraintd.v1 import constraintd_pb2_grpc as pb_grpc

__all__ = ["VOCAB_PART_BYTES", "AsyncGrpcTransport", "GrpcTransport", "vocab_parts"]

VOCAB_PART_BYTES = 256 * 1024


def vocab_parts(
    request: pb.RegisterVocabRequest, part_bytes: int = VOCAB_PART_BYTES
) -> list[pb.RegisterVocabRequest]:
    """`request` cut into RegisterVocabRequests of about `part_bytes` each (a value larger than that alone
    in its part) whose merge in order is `request`, as RegisterVocabParts takes them: the first holds the
    end-of-generation tokens and the tokenizer, each next one a run of pieces, token texts or attributes."""
    listed = request.pieces
    first = pb.RegisterVocabRequest()
    first.pieces.SetInParent()
    first.pieces.eog.extend(listed.eog)
    if listed.HasField("tokenizer"):
        first.pieces.tokenizer.CopyFrom(listed.tokenizer)
    parts = [first]
    # each value's bytes on the wire, near enough: its own, and up to 3 of key and length (5 for a varint)
    sizes = {
        "pieces": [len(piece) + 3 for piece in listed.pieces],
        "token_texts": [len(text.encode("utf-8", "surrogatepass")) + 3 for text in listed.token_texts],
        "token_attrs": [5] * len(listed.token_attrs),
    }
    for name, each in sizes.items():
        values = getattr(listed, name)
        start = total = 0
        for end, size in enumerate(each):
            if total + size > part_bytes and end > start:
                parts.append(pb.RegisterVocabRequest(pieces=pb.PieceList(**{name: values[start:end]})))
                start = end
                total = 0
            total += size
        if start < len(each):
            parts.append(pb.RegisterVocabRequest(pieces=pb.PieceList(**{name: values[start:]})))
    return parts


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


def _connect(
    channels: Any, target: str, tls: ClientTls | None, token: str | None, max_message_bytes: int
) -> tuple[Any, Any, Sequence[tuple[str, str]] | None]:
    """A channel from `channels` (`grpc` or `grpc.aio`: the same functions), its stub and call metadata."""
    options = _options(tls, max_message_bytes)
    if tls is None:
        channel = channels.insecure_channel(target, options=options)
    else:
        channel = channels.secure_channel(target, _credentials(tls), options=options)
    stub = pb_grpc.ConstraintdStub(channel)  # type: ignore[no-untyped-call]
    return channel, stub, _metadata(token)


def _failure(call: Any) -> ConstraintdError:
    """The error a failed call of grpc's blocking API (the `grpc.RpcError` it raised) stands for."""
    try:
        status = rpc_status.from_call(call)
    except ValueError:  # a Status that contradicts the call's own code or message: not the server's
        status = None
    return _decoded(call.code(), call.details() or "", status)


async def _async_failure(call: Any) -> ConstraintdError:
    """The error a failed grpc.aio call (or stream) stands for."""
    try:
        status = await rpc_status.aio.from_call(call)
    except ValueError:
        status = None
    return _decoded(await call.code(), await call.details() or "", status)


def _decoded(code: grpc.StatusCode, details: str, status: status_pb2.Status | None) -> ConstraintdError:
    return error_from(status) if status is not None else error_for(code.name, details)


class _BlockingStepStream:
    """One Step stream over grpc's blocking API, one message at a time: write a request, read its reply.

    grpc's blocking API reads a stream's requests from an iterator, on a thread of its own, and has no
    deadline for one read. So the iterator (`_feed`) keeps the deadline: after handing grpc a request, it
    waits for the next one only until the outstanding request's deadline, and if its reply has not been
    read by then it cancels the call, which ends the blocked read with CANCELLED (`expired` says why).
    """

    def __init__(self, stub: Any, metadata: Sequence[tuple[str, str]] | None) -> None:
        self._requests: queue.SimpleQueue[tuple[Any, float | None] | None] = queue.SimpleQueue()
        self.sent = 0
        self.answered = 0
        self.expired = False
        self.call = stub.Step(self._feed(), metadata=metadata, wait_for_ready=True)

    def _feed(self) -> Iterator[Any]:
        deadline: float | None = None  # of the request sent last, while its reply may be unread
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                item = self._requests.get(timeout=wait)
            except queue.Empty:
                if self.answered < self.sent:
                    self.expired = True
                    self.call.cancel()
                    return
                deadline = None
                continue
            if item is None:
                return
            request, deadline = item
            self.sent += 1
            yield request

    def exchange(self, request: Any, timeout: float | None) -> Any:
        """The reply to `request`. Raises grpc.RpcError, or StopIteration when the stream has ended."""
        self._requests.put((request, None if timeout is None else time.monotonic() + timeout))
        reply = next(self.call)
        self.answered += 1
        return reply

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()


class GrpcTransport:
    """Blocking calls over a `grpc.Channel`; Accept and Step over a Step stream kept open."""

    def __init__(
        self,
        target: str,
        *,
        tls: ClientTls | None = None,
        token: str | None = None,
        max_message_bytes: int = 64 * MIB,
    ) -> None:
        self._channel, self._stub, self._metadata = _connect(grpc, target, tls, token, max_message_bytes)
        self._stream: _BlockingStepStream | None = None
        self._stream_lock = threading.Lock()

    def call(self, method: str, request: Any, *, timeout: float | None) -> Any:
        if method in ("Accept", "Step") and self._stream_lock.acquire(blocking=False):
            try:
                if method == "Accept":
                    return _only_accept(self._exchange(_step_of(request), timeout))
                return self._exchange(request, timeout)
            finally:
                self._stream_lock.release()
        try:
            if method == "Step":
                replies = self._stub.Step(
                    iter((request,)), timeout=timeout, metadata=self._metadata, wait_for_ready=True
                )
                return next(replies)
            if method == "RegisterVocab" and request.ByteSize() > VOCAB_PART_BYTES:
                return self._stub.RegisterVocabParts(
                    iter(vocab_parts(request)), timeout=timeout, metadata=self._metadata, wait_for_ready=True
                )
            return getattr(self._stub, method)(
                request, timeout=timeout, metadata=self._metadata, wait_for_ready=True
            )
        except grpc.RpcError as error:
            raise _failure(error) from None

    def _exchange(self, request: pb.StepRequest, timeout: float | None) -> pb.StepResponse:
        """A Step message on the open stream, and its reply (with the stream lock held; a thread that finds
        it taken opens a stream of its own for the call, so threads sharing a client never wait for each
        other)."""
        if self._stream is None:
            self._stream = _BlockingStepStream(self._stub, self._metadata)
        stream = self._stream
        try:
            reply: pb.StepResponse = stream.exchange(request, timeout)
        except grpc.RpcError as error:
            self._drop_stream()
            if stream.expired:
                raise DeadlineError(f"no Step reply within {timeout} s") from None
            raise _stream_failure(error.code(), error.details() or "", _failure(error)) from None
        except StopIteration:
            self._drop_stream()
            raise UnavailableError("the Step stream ended") from None
        return reply

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def close(self) -> None:
        with self._stream_lock:
            self._drop_stream()
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
        self._channel, self._stub, self._metadata = _connect(
            grpc.aio, target, tls, token, max_message_bytes
        )
        self._stream: Any = None
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._reader: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()

    async def call(self, method: str, request: Any, *, timeout: float | None) -> Any:
        if method == "Step":
            return await self._step(request, timeout)
        if method == "Accept":  # the hot path: a message on the open stream costs less than a unary call
            reply = await self._step(_step_of(request), timeout)
            return _only_accept(reply)
        if method == "RegisterVocab" and request.ByteSize() > VOCAB_PART_BYTES:
            call = self._stub.RegisterVocabParts(
                iter(vocab_parts(request)), timeout=timeout, metadata=self._metadata, wait_for_ready=True
            )
        else:
            call = getattr(self._stub, method)(
                request, timeout=timeout, metadata=self._metadata, wait_for_ready=True
            )
        try:
            return await call
        except grpc.RpcError:
            raise await _async_failure(call) from None

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
            except grpc.RpcError:  # the call is over; its status says why (the write's own error does not)
                self._drop_stream(await _ending(stream))
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
        except grpc.RpcError:
            failure = await _ending(stream)
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


# grpc.aio's status for a stream whose connection broke under a write: not the server's (its INTERNAL
# says "internal error (logged by the server)"), so it is taken for what it is, the service gone.
_CORE_INTERNAL = "Internal error from Core"


def _stream_failure(code: grpc.StatusCode, details: str, failure: ConstraintdError) -> ConstraintdError:
    """What a Step stream's end means to its callers: its status's error (`failure`), or UNAVAILABLE when it
    ended well, was cancelled, or its connection broke."""
    if code in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED) or (
        code is grpc.StatusCode.INTERNAL and details == _CORE_INTERNAL
    ):
        return UnavailableError(f"the Step stream ended ({code.name}: {details})")
    return failure


async def _ending(stream: Any) -> ConstraintdError:
    """Why a Step stream ended (a write's or a read's own error does not say: the call's status does)."""
    code, details = await stream.code(), await stream.details() or ""
    return _stream_failure(code, details, await _async_failure(stream))


def _step_of(request: pb.AcceptRequest) -> pb.StepRequest:
    """A Step of the one accept `request` (copied once: `StepRequest(ops=[StepOp(accept=request)])` copies
    it twice)."""
    step = pb.StepRequest()
    step.ops.add().accept.CopyFrom(request)
    return step


def _only_accept(reply: pb.StepResponse) -> pb.AcceptResponse:
    """The AcceptResponse of a Step of one accept, or the error it answered, raised."""
    results = reply.results
    if len(results) != 1:
        raise UnavailableError("the Step reply does not answer its one accept")
    result = results[0]
    if result.WhichOneof("result") == "error":
        raise error_from(result.error)
    return result.accept


def _fail_all(waiting: collections.deque[asyncio.Future[Any]], failure: ConstraintdError) -> None:
    while waiting:
        answered = waiting.popleft()
        if not answered.done():
            answered.set_exception(failure)
