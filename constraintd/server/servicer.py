# The gRPC servicer of constraintd.v1.Constraintd: it translates, it does not decide.
#
# Invariants:
# - Each method hands its request to `Operations` (which decodes, calls the engine, encodes) and returns
#   the reply; the slow parts run in worker threads, with a time limit, so the event loop keeps answering
#   everyone else: RegisterVocab and a CreateSession whose constraint is not compiled yet in the compile
#   pool, and every whole-vocabulary mask (Mask, a rejected Accept that asks for one, Step's) in the mask
#   pool, computed on a fork of the session's matcher so the session itself is never touched off the loop;
#   and a long replay (a client rebuilding a lost session) on a matcher no session holds yet.
# - Errors become gRPC statuses in exactly one function, `status_of`: a `ConstraintdError` maps to the
#   status its class names, with its message, and carries its google.rpc.Status (service/status.py: its
#   class and parts as ErrorInfo and BadRequest details) in the trailing metadata, as grpcio-status sends
#   it; anything else is a bug, answered INTERNAL with no details and logged with its traceback.
# - A request whose bytes do not decode as its message is answered INVALID_ARGUMENT by the method it was
#   sent to, like any other bad input (grpc itself would answer UNKNOWN, uncounted): `add_to_server`
#   registers the methods with decoders that hand such a request over as `Undecodable`.
# - A Step message is done a slice of its operations at a time (Operations.step_slices), and once it has
#   held the event loop STEP_HOLD seconds it lets every other call waiting run before its next slice: its
#   4,096 operations may each cost a lazy grammar's scan (a message of them held every other session's
#   Accept for most of a second). Its operations stay on the loop, where every session is touched.
# - A request of more than PARSE_ON_LOOP bytes is not parsed on the event loop (a 19 MB one held every
#   other call 100-280 ms): the decoders hand it over as `Large`, and the method parses it in a worker
#   thread, in slices (large.py), with the compile pool's time limit. RegisterVocabParts' parts come as
#   bytes, counted against `max_vocab_bytes` as they come, and are parsed the same way, together.
# - A CreateSession hands its grammar to the lookahead worker (ahead.py), which learns its first masks'
#   verdicts while the session's prompt is evaluated; every compile and mask job is held as `busy` around
#   it, so the lookahead only runs while no caller waits for one.
# - Every answer (and every Step message) is counted and timed in the metrics, by method and status, and
#   every error a Step answers in an operation's place, by operation and status.
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2, status_pb2
from grpc_status import rpc_status

from constraintd.errors import ConstraintdError, InputError
from constraintd.server.ahead import AheadWorker
from constraintd.server.large import PARSE_ON_LOOP, Large
from constraintd.server.metrics import Metrics
from constraintd.server.workers import WorkerPool
from constraintd.service.log_events import fields
from constraintd.service.operations import INLINE_COST, Operations, Owed, pay
from constraintd.service.status import status_for
from constraintd.v1 import constraintd_pb2 as pb
from constraintd.v1 import constraintd_pb2_grpc as pb_grpc

__all__ = ["ConstraintdServicer", "Undecodable", "add_to_server", "status_of"]

log = logging.getLogger("constraintd.server")

Request = TypeVar("Request")
Reply = TypeVar("Reply")
T = TypeVar("T")
Context: TypeAlias = "grpc.aio.ServicerContext"
Method = Callable[[Any, Request, Context], Awaitable[Reply]]

# A session rebuilt with more tokens than this replays them in a worker thread (tens of microseconds each),
# and so does a session started past a prefill of more bytes than this (as much a code point).
REPLAY_ON_LOOP = 32
PREFILL_ON_LOOP = 256
# The event loop's time a Step message takes before it lets the calls waiting run. A normal Accept's
# answer takes a few turns of the loop, each waiting for the slice running: with a lazy session waiting
# through 1M tokens in Steps, other sessions' Accepts had p50 / p99 2.4 / 7.4 ms at 1 ms, 1.2 / 4.8 ms at
# 0.25 ms (bench_soak, load 5).
STEP_HOLD = 0.00025


# What a bug answers: no message of its own (its text may hold anything) and no details.
_INTERNAL = status_pb2.Status(code=code_pb2.INTERNAL, message="internal error (logged by the server)")


def status_of(error: Exception) -> grpc.Status:
    """The gRPC status a failed call answers with: code, message, and in the trailing metadata the
    google.rpc.Status with the error's class and parts. The only such mapping."""
    return rpc_status.to_status(status_for(error) if isinstance(error, ConstraintdError) else _INTERNAL)


class Undecodable:
    """A request whose bytes are not a message of its method's request type."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def error(self) -> InputError:
        return InputError(f"the request is not a valid {self.type_name} message")


def _decoder(message_type: type[Message]) -> Callable[[bytes], Message | Undecodable | Large]:
    parse = message_type.FromString
    undecodable = Undecodable(message_type.DESCRIPTOR.full_name)

    def decode(data: bytes) -> Message | Undecodable | Large:
        if len(data) > PARSE_ON_LOOP:
            return Large(data, message_type)
        try:
            return parse(data)
        except DecodeError:
            return undecodable

    return decode


# (client streams, server streams) -> the handler of that kind
_HANDLERS: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


# methods whose requests are handed over as their bytes: the parts of one request, parsed together
_UNPARSED = frozenset({"RegisterVocabParts"})


def add_to_server(servicer: ConstraintdServicer, server: grpc.aio.Server) -> None:
    """Registers the servicer's methods as the generated `add_ConstraintdServicer_to_server` does (from
    the same service descriptor), but with decoders that hand an undecodable request to the method."""
    service = pb.DESCRIPTOR.services_by_name["Constraintd"]
    handlers = {
        method.name: _HANDLERS[method.client_streaming, method.server_streaming](
            getattr(servicer, method.name),
            request_deserializer=(
                None if method.name in _UNPARSED else _decoder(getattr(pb, method.input_type.name))
            ),
            response_serializer=getattr(pb, method.output_type.name).SerializeToString,
        )
        for method in service.methods
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


def _answered(method: Method[Request, Reply]) -> Method[Request, Reply]:
    """Counts, times and translates the errors of one unary method."""
    name = method.__name__

    @functools.wraps(method)
    async def answer(self: ConstraintdServicer, request: Request, context: Context) -> Reply:
        started = time.perf_counter()
        try:
            if isinstance(request, Large):
                request = await self._parse(request)
            if isinstance(request, Undecodable):
                raise request.error()
            reply = await method(self, request, context)
        except Exception as error:
            status = self.failed(name, error)
        else:
            self.metrics.rpcs.inc(name, "OK")
            self.metrics.rpc_seconds.observe(time.perf_counter() - started, name)
            return reply
        # aborted out of the handler, and without the request: grpc keeps the abort's exception (and with it
        # this frame) for a while, and neither the error (its context otherwise, whose traceback holds the
        # frames below) nor the request (a refused vocabulary's can be 100s of MB) must stay with it
        del request
        await context.abort_with_status(status)
        raise AssertionError("unreachable: abort_with_status raises")

    return answer


class _StepCounts:
    """A Step's operations and the errors answered in their place, counted in the metrics as the
    operations tell them (Operations.step_slices' StepTally)."""

    __slots__ = ("_errors", "_operations")

    def __init__(self, metrics: Metrics) -> None:
        self._operations = metrics.step_ops.inc
        self._errors = metrics.step_errors.inc

    def asked(self, kind: str, count: int) -> None:
        self._operations(kind, by=count)

    def failed(self, kind: str, code: int) -> None:
        self._errors(kind, code_pb2.Code.Name(code))


class ConstraintdServicer(pb_grpc.ConstraintdServicer):
    """constraintd.v1.Constraintd over one `Operations`."""

    def __init__(
        self,
        operations: Operations,
        *,
        compile_workers: WorkerPool,
        mask_workers: WorkerPool,
        metrics: Metrics,
        ahead: AheadWorker | None = None,
    ) -> None:
        self.operations = operations
        self.compile_workers = compile_workers
        self.mask_workers = mask_workers
        self.metrics = metrics
        self._step_counts = _StepCounts(metrics)
        # learns new grammars' first verdicts while no compile or mask job runs (None: off)
        self.ahead = ahead
        self._busy: Callable[[], contextlib.AbstractContextManager[None]] = (
            ahead.busy if ahead is not None else contextlib.nullcontext
        )

    def failed(self, method: str, error: Exception) -> grpc.Status:
        """The status a call ends with for `error` (counted; a bug is logged with its traceback)."""
        status = status_of(error)
        self.metrics.rpcs.inc(method, status.code.name)
        if status.code is grpc.StatusCode.INTERNAL:
            log.error("internal error", exc_info=error, extra=fields(method=method))
        return status

    async def _parse(self, large: Large) -> Any:
        """A large request, parsed off the loop; Undecodable when it is not its type's message."""
        deadline = time.monotonic() + self.compile_workers.time_limit  # the work stops with the answer

        most = self.operations.record_bounds()

        def parse() -> Message | Undecodable:
            try:
                return large.parse(deadline, most)
            except DecodeError:
                return Undecodable(large.message_type.DESCRIPTOR.full_name)

        with self._busy():
            return await self.compile_workers.run(parse, what="reading the request")

    async def _off_loop(self, work: Callable[[], T], what: str) -> T:
        started = time.perf_counter()
        outcome = "error"
        try:
            with self._busy():
                result = await self.compile_workers.run(work, what=what)
            outcome = "ok"
            return result
        finally:
            self.metrics.compile_seconds.observe(time.perf_counter() - started, outcome)

    @_answered
    async def RegisterVocab(
        self, request: pb.RegisterVocabRequest, context: Context
    ) -> pb.RegisterVocabResponse:
        return await self._register(request)

    @_answered
    async def RegisterVocabParts(
        self, request: AsyncIterator[bytes], context: Context
    ) -> pb.RegisterVocabResponse:
        # the parts come unparsed (add_to_server), are counted as they come, and are parsed together off
        # the loop as their concatenation
        parts: list[bytes] = []
        size = 0
        async for part in request:
            size += len(part)
            self.operations.check_vocab_bytes(size)
            parts.append(part)
        parsed = await self._parse(Large(parts, pb.RegisterVocabRequest))
        del parts  # up to max_vocab_bytes, not held while the vocabulary is built from what they made
        if isinstance(parsed, Undecodable):
            raise parsed.error()
        return await self._register(parsed)

    async def _register(self, request: pb.RegisterVocabRequest) -> pb.RegisterVocabResponse:
        reply = await self._off_loop(
            lambda: self.operations.register_vocab(request), "loading the vocabulary"
        )
        log.info("vocabulary registered", extra=fields(vocab_id=reply.vocab_id, size=reply.size))
        return reply

    @_answered
    async def CreateSession(
        self, request: pb.CreateSessionRequest, context: Context
    ) -> pb.CreateSessionResponse:
        plan = self.operations.plan_session(request)
        compiled = plan.compiled
        if compiled is None:
            compiled = await self._off_loop(lambda: self.operations.compile(plan), "compiling the constraint")
        started = None
        if len(plan.replay) > REPLAY_ON_LOOP or len(plan.prefill) > PREFILL_ON_LOOP:
            ready = compiled
            # the prefill and replay stop at the time limit the caller is answered DEADLINE_EXCEEDED at
            deadline = time.monotonic() + self.compile_workers.time_limit
            started = await self._off_loop(
                lambda: self.operations.start(plan, ready, deadline=deadline), "taking the prefill and replay"
            )
        reply = self.operations.open_session(plan, compiled, started)
        if self.ahead is not None:
            # its prompt is evaluated now: time its grammar's first masks can be learnt in
            self.ahead.submit(compiled.grammar)
        return reply

    async def _pay(self, owed: list[Owed]) -> None:
        # masks the grammars keep and a few checks are paid here (a few at a time: the loop is not held for
        # long); anything to compute goes to a worker thread, all together
        if not owed:
            return
        if sum(work.cost() for work in owed) <= INLINE_COST:
            pay(owed)
        else:
            # the work stops itself when its caller is answered DEADLINE_EXCEEDED
            deadline = time.monotonic() + self.mask_workers.time_limit
            with self._busy():
                await self.mask_workers.run(lambda: pay(owed, deadline=deadline), what="computing the mask")

    @_answered
    async def Accept(self, request: pb.AcceptRequest, context: Context) -> pb.AcceptResponse:
        reply, owed = self.operations.accept_owing(request)
        if owed:
            await self._pay(owed)
        return reply

    @_answered
    async def Allows(self, request: pb.AllowsRequest, context: Context) -> pb.AllowsResponse:
        reply, owed = self.operations.allows_owing(request)
        await self._pay(owed)
        return reply

    @_answered
    async def Mask(self, request: pb.MaskRequest, context: Context) -> pb.MaskResponse:
        reply, owed = self.operations.mask_owing(request)
        await self._pay(owed)
        return reply

    @_answered
    async def Rollback(self, request: pb.RollbackRequest, context: Context) -> pb.RollbackResponse:
        return self.operations.rollback(request)

    @_answered
    async def Fork(self, request: pb.ForkRequest, context: Context) -> pb.ForkResponse:
        return self.operations.fork(request)

    @_answered
    async def Close(self, request: pb.CloseRequest, context: Context) -> pb.CloseResponse:
        return self.operations.close(request)

    async def Step(
        self, requests: AsyncIterator[pb.StepRequest], context: Context
    ) -> AsyncIterator[pb.StepResponse]:
        metrics = self.metrics
        tally = self._step_counts
        try:
            async for request in requests:
                if isinstance(request, Large):  # typed as a StepRequest: see add_to_server
                    request = await self._parse(request)
                if isinstance(request, Undecodable):  # typed as a StepRequest: see add_to_server
                    raise request.error()
                started = time.perf_counter()
                # its slices run here, not in a coroutine of their own: a message of a few operations is
                # one slice, answered with no await in between
                slices = self.operations.step_slices(request, tally=tally)
                held = started
                while True:
                    try:
                        next(slices)
                    except StopIteration as done:
                        answer: tuple[pb.StepResponse, list[Owed]] = done.value
                        break
                    if time.perf_counter() - held > STEP_HOLD:
                        await asyncio.sleep(0)  # the calls waiting run now
                        held = time.perf_counter()
                reply, owed = answer
                if owed:
                    await self._pay(owed)
                metrics.rpcs.inc("Step", "OK")
                metrics.rpc_seconds.observe(time.perf_counter() - started, "Step")
                yield reply
        except Exception as error:
            status = self.failed("Step", error)
        else:
            return
        await context.abort_with_status(status)  # out of the handler, as in `_answered`
