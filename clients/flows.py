# The client's protocol logic, once, for the sync and the async client: retries, session recovery, and
# what each call does to the client's record of a session.
#
# A flow is a generator that yields actions (`Call` an RPC, `Pause`) and receives their outcomes: a
# reply is sent in, a failure is thrown in as a `ConstraintdError`. It does no I/O itself, so `Client`
# drives flows with blocking calls and `time.sleep`, and `AsyncClient` with awaits (h11's sans-I/O idea).
#
# Invariants:
# - A session record holds every token the session accepted, in order. The client's record is the truth:
#   when the server has lost the session (NOT_FOUND: expired, or the server restarted) or disagrees about
#   it (ABORTED: a retried request it had already applied), the flow rebuilds the session with
#   CreateSession(replay = the record's tokens), re-registering the vocabulary first if that is gone too,
#   and then runs the call again. The rebuilt session is in exactly the state the lost one was.
# - Requests that change a session carry `position` (the record's token count), so a retry can never apply
#   a token twice.
# - A call failing with UNAVAILABLE is retried after a pause that doubles up to a bound; other failures
#   are raised to the caller as they are.
# - The record changes only after the server answered (an accepted token is appended then, not before).
from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt
from google.rpc import status_pb2

from clients.chat import ChatSettings
from clients.masks import mask_from_wire
from clients.status import error_from
from constraintd.errors import NotFoundError, PositionError, UnavailableError
from constraintd.v1 import constraintd_pb2 as pb

__all__ = [
    "Call",
    "Flow",
    "Pause",
    "Policy",
    "SessionRecord",
    "StepOutcome",
    "VocabHandle",
]

T = TypeVar("T")
Mask = npt.NDArray[np.int32]


# A named tuple rather than a frozen dataclass, as StepOutcome below: every Accept makes one.
class Call(NamedTuple):
    """Make one RPC: `method` is its name in the service ("Accept"); the reply is sent back in."""

    method: str
    request: Any
    timeout: float | None


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait this many seconds, then go on."""

    seconds: float


Action = Call | Pause
Flow = Generator[Action, Any, T]


@dataclass(frozen=True, slots=True)
class Policy:
    """How long calls may take and how hard a client tries.

    Attributes:
        timeout: deadline of one call on a session, in seconds (None: no deadline).
        setup_timeout: deadline of RegisterVocab and CreateSession, which may compile.
        attempts: tries of one call while the service is UNAVAILABLE (a restart, a dropped connection).
        backoff: the first pause between tries, doubled each time up to `max_backoff`.
        max_backoff: the longest pause.
        rebuilds: times one call may rebuild its session (lost or out of step) before giving up.
    """

    timeout: float | None = 10.0
    setup_timeout: float | None = 120.0
    attempts: int = 8
    backoff: float = 0.05
    max_backoff: float = 2.0
    rebuilds: int = 2


@dataclass(frozen=True, slots=True)
class VocabHandle:
    """A registered vocabulary: its id, size, content hash, and how it was registered (to do it again)."""

    id: str
    size: int
    content_hash: str
    registration: pb.RegisterVocabRequest


class SessionRecord:
    """What a client knows of one session: enough to rebuild it anywhere."""

    __slots__ = ("chat", "closed", "complete", "history", "id", "request", "vocab", "warnings")

    def __init__(self, vocab: VocabHandle, request: pb.CreateSessionRequest) -> None:
        self.vocab = vocab
        self.request = request  # the CreateSession request, without replay
        self.id = ""
        self.history: list[int] = []
        self.complete = False
        self.warnings: tuple[str, ...] = ()
        self.chat: ChatSettings | None = None  # a session made from a chat request
        self.closed = False

    def copy(self) -> SessionRecord:
        twin = SessionRecord(self.vocab, self.request)
        twin.history = list(self.history)
        twin.complete = self.complete
        twin.warnings = self.warnings
        twin.chat = self.chat
        return twin


# A named tuple rather than a frozen dataclass: a Step batch makes one per item on the hot path, and a
# frozen dataclass's __init__ (three object.__setattr__ calls) costs about twice a named tuple's.
class StepOutcome(NamedTuple):
    """One accept of a batch: whether it was taken, whether the grammar may end, and the mask if asked.

    For a mask-only item `accepted` is None and `mask` is the mask.
    """

    accepted: bool | None
    complete: bool
    mask: Mask | None


def retried(policy: Policy, call: Call) -> Flow[Any]:
    """The reply to `call`, retried while the service is UNAVAILABLE."""
    pause = policy.backoff
    for attempt in range(policy.attempts):
        try:
            return (yield call)
        except UnavailableError:
            if attempt == policy.attempts - 1:
                raise
        yield Pause(pause)
        pause = min(pause * 2, policy.max_backoff)
    raise AssertionError("unreachable: the last attempt returns or raises")


def register(policy: Policy, registration: pb.RegisterVocabRequest) -> Flow[VocabHandle]:
    reply = yield from retried(policy, Call("RegisterVocab", registration, policy.setup_timeout))
    return VocabHandle(reply.vocab_id, reply.size, reply.content_hash, registration)


def create(policy: Policy, record: SessionRecord) -> Flow[None]:
    """Opens the record's session on the server, replaying its tokens; re-registers a lost vocabulary (again
    if the server loses it once more, a restart between the registration and the session, up to
    `policy.rebuilds` times)."""
    request = pb.CreateSessionRequest()
    request.CopyFrom(record.request)
    request.replay.extend(record.history)
    for registration in range(policy.rebuilds + 1):
        try:
            reply = yield from retried(policy, Call("CreateSession", request, policy.setup_timeout))
            break
        except NotFoundError:
            if registration == policy.rebuilds:
                raise
        vocab = yield from register(policy, record.vocab.registration)
        request.vocab_id = vocab.id
    else:
        raise AssertionError("unreachable: the last try breaks or raises")
    record.id = reply.session_id
    record.complete = reply.state.complete
    record.warnings = tuple(reply.warnings)
    if reply.HasField("chat") and record.chat is None:  # a rebuilt session resolved exactly as the first
        record.chat = ChatSettings.from_proto(reply.chat)


def on_session(policy: Policy, record: SessionRecord, build: Callable[[], Any], method: str) -> Flow[Any]:
    """The reply to a call on the record's session, rebuilding the session when it is lost or out of step."""
    for rebuild in range(policy.rebuilds + 1):
        try:
            return (yield from retried(policy, Call(method, build(), policy.timeout)))
        except (NotFoundError, PositionError):
            if rebuild == policy.rebuilds or record.closed:
                raise
        yield from create(policy, record)
    raise AssertionError("unreachable: the last rebuild returns or raises")


def accept(
    policy: Policy, record: SessionRecord, token: int, *, mask_on_reject: bool, mask_after: bool = False
) -> Flow[tuple[bool, Mask | None]]:
    """Accept: whether the token was taken, and on a rejection the mask if asked for (`mask_after`: the
    mask of the state after the call, always)."""
    reply = yield from on_session(
        policy,
        record,
        lambda: pb.AcceptRequest(
            session_id=record.id,
            token=token,
            mask_on_reject=mask_on_reject,
            mask_after=mask_after,
            position=len(record.history),
        ),
        "Accept",
    )
    return _took(record, token, reply)


def accept_ahead(policy: Policy, record: SessionRecord, token: int) -> Flow[tuple[bool, Mask]]:
    """Accept with `mask_after`: whether the token was taken, and the mask of the state after the call."""
    taken, words = yield from accept(policy, record, token, mask_on_reject=True, mask_after=True)
    if words is None:
        raise UnavailableError("the reply to an Accept with mask_after holds no mask")
    return taken, words


def _took(record: SessionRecord, token: int, reply: pb.AcceptResponse) -> tuple[bool, Mask | None]:
    record.complete = reply.state.complete
    accepted: bool = reply.accepted
    if accepted:
        record.history.append(token)
    return accepted, mask_from_wire(reply.mask) if reply.HasField("mask") else None


def allows(policy: Policy, record: SessionRecord, tokens: list[int]) -> Flow[list[bool]]:
    reply = yield from on_session(
        policy, record, lambda: pb.AllowsRequest(session_id=record.id, tokens=tokens), "Allows"
    )
    return list(reply.allowed)


def mask(policy: Policy, record: SessionRecord) -> Flow[Mask]:
    reply = yield from on_session(policy, record, lambda: pb.MaskRequest(session_id=record.id), "Mask")
    return mask_from_wire(reply.mask)


def rollback(policy: Policy, record: SessionRecord, count: int) -> Flow[None]:
    if not 0 <= count <= len(record.history):
        raise ValueError(f"cannot roll back {count} tokens of {len(record.history)}")
    reply = yield from on_session(
        policy,
        record,
        lambda: pb.RollbackRequest(session_id=record.id, count=count, position=len(record.history)),
        "Rollback",
    )
    del record.history[len(record.history) - count :]
    record.complete = reply.state.complete


def fork(policy: Policy, record: SessionRecord) -> Flow[SessionRecord]:
    reply = yield from on_session(
        policy, record, lambda: pb.ForkRequest(session_id=record.id, position=len(record.history)), "Fork"
    )
    child = record.copy()
    child.id = reply.session_id
    child.complete = reply.state.complete
    return child


def close(policy: Policy, record: SessionRecord) -> Flow[None]:
    """Closes the session; a session the server no longer has is closed already."""
    if record.closed:
        return
    record.closed = True
    with contextlib.suppress(NotFoundError):
        yield from retried(policy, Call("Close", pb.CloseRequest(session_id=record.id), policy.timeout))


def step(
    policy: Policy,
    items: list[tuple[SessionRecord, int | None]],
    *,
    mask_on_reject: bool,
    mask_after: bool = False,
) -> Flow[list[StepOutcome]]:
    """A batch over many sessions in one Step message; an item whose session was lost is redone alone.

    The accepts travel as the message's accept batch (columns: ids, tokens, positions), the mask-only
    items as operations. With `mask_after`, every accept answers the mask of its session's state after it.

    Raises:
        ValueError: a session has two items in the batch (each would expect the position before both).
    """
    if len({id(record) for record, _ in items}) != len(items):
        raise ValueError("a Step batch holds at most one item per session")
    request = pb.StepRequest()
    batch = request.accepts
    accepting = [(record, token) for record, token in items if token is not None]
    batch.session_ids.extend([record.id for record, _ in accepting])
    batch.tokens.extend([token for _, token in accepting])
    batch.positions.extend([len(record.history) for record, _ in accepting])
    batch.mask_on_reject = mask_on_reject
    batch.mask_after = mask_after
    for record, token in items:
        if token is None:
            request.ops.add().mask.session_id = record.id
    reply = yield from retried(policy, Call("Step", request, policy.timeout))
    answer = reply.accepts
    accepted = list(answer.accepted)
    complete = list(answer.complete)
    if len(accepted) != len(accepting) or len(reply.results) != len(items) - len(accepting):
        raise UnavailableError("the Step reply does not answer every item of the batch")
    errors = {item.index: item.error for item in answer.errors}
    masks = {item.index: item.mask for item in answer.masks}
    if mask_after and len(masks) + len(errors) != len(accepting):
        raise UnavailableError("the Step reply does not answer every mask_after item with its mask")
    results = iter(reply.results)
    index = -1  # of the current item in the accept batch
    outcomes: list[StepOutcome] = []
    for record, token in items:
        if token is None:
            result = next(results)
            if result.WhichOneof("result") != "error":
                words = mask_from_wire(result.mask.mask)
                outcomes.append(StepOutcome(None, result.mask.state.complete, words))
                continue
            failed = result.error
        else:
            index += 1
            failed = errors.get(index)
            if failed is None:
                record.complete = complete[index]
                if accepted[index]:
                    record.history.append(token)
                owed = masks.get(index)
                words_or_none = mask_from_wire(owed) if owed is not None else None
                outcomes.append(StepOutcome(accepted[index], record.complete, words_or_none))
                continue
        outcome = yield from _redone(
            policy, record, token, failed, mask_on_reject=mask_on_reject, mask_after=mask_after
        )
        outcomes.append(outcome)
    return outcomes


def _redone(
    policy: Policy,
    record: SessionRecord,
    token: int | None,
    failed: status_pb2.Status,
    *,
    mask_on_reject: bool,
    mask_after: bool,
) -> Flow[StepOutcome]:
    """A batch item that failed: redone alone after a rebuild when its session was lost, raised otherwise."""
    error = error_from(failed)
    if record.closed or not isinstance(error, (NotFoundError, PositionError)):
        raise error
    yield from create(policy, record)
    if token is None:
        words = yield from mask(policy, record)
        return StepOutcome(None, record.complete, words)
    taken, words_or_none = yield from accept(
        policy, record, token, mask_on_reject=mask_on_reject, mask_after=mask_after
    )
    return StepOutcome(taken, record.complete, words_or_none)
