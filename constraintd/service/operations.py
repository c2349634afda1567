# Every RPC of constraintd.v1 as a plain function of its request message: decode, call the engine, encode.
#
# Invariants:
# - This is the one place that translates between the wire messages and the engine; it decides nothing
#   the engine decides (which tokens are allowed, what a grammar means) and holds no state of its own
#   (the registry and the session store hold it).
# - No grpc and no asyncio here: the gRPC servicer calls these on the event loop (and the slow ones,
#   `register_vocab` and `compile`, in worker threads), and the in-process client transport calls them
#   directly, so both speak exactly the same protocol.
# - Errors are raised as `ConstraintdError`s; the caller turns them into statuses. In a Step, each
#   operation's error is answered in its place, as the google.rpc.Status the unary call would have failed
#   with (service/status.py), and the others still run; a Step's accept batch (the
#   columns of many sessions' accepts) is answered after its operations, in columns too, with no message
#   built per item but per error and per owed mask: it is the hot path of a worker decoding many sequences.
# - A whole-vocabulary mask can take milliseconds to seconds the first time a grammar state is met, so the
#   `*_owing` forms answer everything else at once and return the masks they owe as `OwedMask`es: a fork
#   of the matcher taken at that moment (so later accepts cannot change what the mask is of) and the reply
#   field to fill. The server pays them in a worker thread; the plain forms pay them inline.
# - A Step message's operations are many small units of work (up to `max_step_ops`; an accept can cost
#   tens to hundreds of microseconds, a lazy grammar's while it waits), so `step_slices` does them as a
#   generator that stops after every STEP_SLICE of them: the server takes a slice at a time and lets other
#   calls run between two (a message of 4,096 accepts of a waiting lazy grammar held the event loop for
#   most of a second). `step_owing` runs it through at once.
# - A mask goes on the wire as the engine makes it: little-endian 32-bit words, token j = bit j % 32 of
#   word j // 32.
from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from constraintd.engine.grammar.triggers import literal_of
from constraintd.engine.masks.compute import check_deadline
from constraintd.engine.matcher import Matcher
from constraintd.engine.schema.extended import DEFAULT_DIALECT, check_dialect
from constraintd.engine.vocab.vocab import TokenizerRules
from constraintd.errors import ConstraintdError, InputError, LimitError, TokenError
from constraintd.service.chat import ChatRequest, ChatSettings, chat_triggers
from constraintd.service.constraints import Constraint, ConstraintKind
from constraintd.service.limits import Limits
from constraintd.service.registry import CompiledConstraint, Registry
from constraintd.service.sessions import Session, SessionStore
from constraintd.service.status import status_for
from constraintd.service.wire import merge_packed_bools
from constraintd.v1 import constraintd_pb2 as pb

__all__ = ["INLINE_COST", "STEP_SLICE", "Operations", "Owed", "OwedChecks", "OwedMask", "SessionPlan",
           "StepTally", "WireMasks", "encode_mask", "pay"]


def encode_mask(words: npt.NDArray[np.int32], vocab_size: int, *, compact: bool = False) -> pb.Mask:
    """The wire form of a packed mask; with `compact`, a mask allowing every token goes as `all_allowed`."""
    little = np.asarray(words, dtype="<i4")
    allowed = int(np.bitwise_count(little.view(np.uint32)).sum(dtype=np.int64))
    if compact and allowed == vocab_size:
        return pb.Mask(vocab_size=vocab_size, allowed=allowed, all_allowed=True)
    return pb.Mask(words=little.tobytes(), vocab_size=vocab_size, allowed=allowed)


# The most a reply's owed work may cost (`cost()`, in mask lookups of about 15 µs) to be paid on the event
# loop; more goes to a worker thread: at most about 4 ms of the loop's time for one reply.
INLINE_COST = 256.0
# Step operations (or accepts of its batch) done between two points where its caller may let other calls run
STEP_SLICE = 8
# Allows checks between two looks at the clock (a check is microseconds: the clock is read every few ms).
CHECKS_BETWEEN_CLOCKS = 1024
# An Allows of more tokens than this checks each distinct token once (`OwedChecks`); ids given as a list
# are read NUMPY_CHUNK at a time (each a hold of the GIL under a millisecond), the answers are merged into
# the reply as packed records (service/wire.py).
DISTINCT_CHECKS_FROM = 4096
NUMPY_CHUNK = 1 << 13


class WireMasks:
    """The wire form of the masks answered lately, by the engine's array: a grammar's masks are read-only
    arrays kept per state, so a state met before answers the same array, and its words and count are
    encoded once. At most `size` are kept, each with its array (an id is never reused while it is a key);
    about 2 x size x vocab_size / 8 bytes."""

    def __init__(self, size: int = 128) -> None:
        self._size = size
        self._kept: dict[int, tuple[npt.NDArray[np.int32], pb.Mask]] = {}

    def encode(self, words: npt.NDArray[np.int32], vocab_size: int, *, compact: bool) -> pb.Mask:
        """`encode_mask(words, vocab_size, compact=compact)`, from the kept ones when it can."""
        if words.flags.writeable:  # an array that may change: not kept
            return encode_mask(words, vocab_size, compact=compact)
        kept = self._kept.get(id(words))
        if kept is None or kept[0] is not words:
            if len(self._kept) >= self._size:
                self._kept.clear()
            kept = (words, encode_mask(words, vocab_size))
            self._kept[id(words)] = kept
        mask = kept[1]
        if compact and mask.allowed == vocab_size:
            return pb.Mask(vocab_size=vocab_size, allowed=vocab_size, all_allowed=True)
        return mask


class OwedMask:
    """A mask a reply still needs: of `matcher` (a fork nobody else holds), into the message `into`, in the
    wire form `wire` keeps; `compact` as `encode_mask`'s (the masks answered to `mask_after`)."""

    __slots__ = ("compact", "into", "matcher", "wire")

    def __init__(self, into: pb.Mask, matcher: Matcher, wire: WireMasks, *, compact: bool = False) -> None:
        self.into = into
        self.matcher = matcher
        self.wire = wire
        self.compact = compact

    def cost(self) -> float:
        """What paying it costs the event loop, in mask lookups: 1 for a mask the grammar keeps, infinite
        for one to compute (a walk of the vocabulary: a worker thread's job)."""
        return 1.0 if self.matcher.mask_known() else math.inf

    def pay(self, deadline: float | None = None) -> None:
        matcher = self.matcher
        words = matcher.mask(deadline=deadline)
        self.into.CopyFrom(self.wire.encode(words, matcher.grammar.n_vocab, compact=self.compact))


class OwedChecks:
    """Allows' answers a reply still needs: each of `tokens` checked on `matcher` (a fork nobody else
    holds), into `into.allowed`."""

    __slots__ = ("into", "matcher", "tokens")

    def __init__(self, into: pb.AllowsResponse, matcher: Matcher, tokens: Sequence[int]) -> None:
        self.into = into
        self.matcher = matcher
        self.tokens = tokens

    def cost(self) -> float:
        """What paying it costs, in mask lookups (a check is about a quarter of one when the state's answer
        is known; more when it is not, which a few thousand checks cannot make long)."""
        return len(self.tokens) / 4

    def pay(self, deadline: float | None = None) -> None:
        tokens = self.tokens
        if len(tokens) > DISTINCT_CHECKS_FROM and self._pay_distinct(deadline):
            return
        allows = self.matcher.allows
        for start in range(0, len(tokens), CHECKS_BETWEEN_CLOCKS):
            check_deadline(deadline)
            chunk = tokens[start : start + CHECKS_BETWEEN_CLOCKS]
            self.into.allowed.extend([allows(token) for token in chunk])

    def _pay_distinct(self, deadline: float | None) -> bool:
        """Many tokens: each distinct one checked once, the answers spread with numpy (a call's cost is then
        bounded by the vocabulary, not by how often a token is repeated). False, with nothing done, when a
        token is outside the vocabulary: the checks one by one raise at the first such token."""
        ids = _token_ids(self.tokens, deadline)
        n_vocab = self.matcher.grammar.n_vocab
        if int(ids.min()) < 0 or int(ids.max()) >= n_vocab:
            return False
        asked = np.zeros(n_vocab, dtype=np.bool_)
        asked[ids] = True
        distinct = np.flatnonzero(asked).tolist()
        verdicts = np.zeros(n_vocab, dtype=np.bool_)
        allows = self.matcher.allows
        for start in range(0, len(distinct), CHECKS_BETWEEN_CLOCKS):
            check_deadline(deadline)
            chunk = distinct[start : start + CHECKS_BETWEEN_CLOCKS]
            verdicts[chunk] = [allows(token) for token in chunk]
        merge_packed_bools(self.into, "allowed", verdicts[ids], deadline=deadline)
        return True


def _token_ids(tokens: Sequence[int], deadline: float | None) -> npt.NDArray[np.int64]:
    """Token ids as an array. A repeated field of a parsed message converts in one C call (numpy reads
    upb's containers directly: a million ids in about a millisecond); a list, NUMPY_CHUNK at a time (each
    chunk's Python ints are read one by one)."""
    if hasattr(tokens, "__array__"):
        return np.asarray(tokens, dtype=np.int64)
    ids = np.empty(len(tokens), dtype=np.int64)
    for start in range(0, len(tokens), NUMPY_CHUNK):
        check_deadline(deadline)
        chunk = tokens[start : start + NUMPY_CHUNK]
        ids[start : start + len(chunk)] = chunk
    return ids


Owed = OwedMask | OwedChecks


class StepTally(Protocol):
    """What the caller of a Step message is told as the message is read and done (the server counts both in
    its metrics)."""

    def asked(self, kind: str, count: int) -> None:
        """The message asks for `count` operations of this kind ("accept", "mask", "allows"; "none" for an
        operation of no kind); told before they are checked or done."""

    def failed(self, kind: str, code: int) -> None:
        """An operation of this kind was answered with an error of this status code in its place."""


def pay(owed: list[Owed], *, deadline: float | None = None) -> None:
    """Computes every owed mask and check into its reply (the slow part; safe in a worker thread).

    Raises:
        DeadlineError: the work was still going at `deadline` (time.monotonic()): it stops there.
    """
    for work in owed:
        work.pay(deadline)


def _state(session: Session) -> pb.SessionState:
    state = pb.SessionState()
    _set_state(state, session)
    return state


def _set_state(state: pb.SessionState, session: Session) -> None:
    # `_state` written into the reply's own field: no message made and copied in (the Accept's hot path)
    state.complete = session.matcher.is_complete()
    state.position = session.position


def _position(request: Any) -> int | None:
    return int(request.position) if request.HasField("position") else None


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """A CreateSession request checked and decoded, waiting for its compiled constraint."""

    vocab_id: str
    constraint: Constraint
    ttl: float
    prefill: bytes
    replay: Sequence[int]  # the request's own field: a million of them is not copied on the event loop
    compiled: CompiledConstraint | None


def _chat_text(request: pb.CreateSessionRequest) -> str:
    # the request as the constraint's text: its time set here when the caller gave none (a template may
    # print the date), so the text says everything the resolution depends on
    chat = request.chat
    return ChatRequest(
        template=chat.template,
        messages=chat.messages or "[]",
        tools=chat.tools,
        tool_choice=chat.tool_choice or "auto",
        parallel_tool_calls=chat.parallel_tool_calls,
        json_schema=chat.json_schema,
        reasoning_format=chat.reasoning_format or "auto",
        enable_thinking=chat.enable_thinking if chat.HasField("enable_thinking") else True,
        bos_text=chat.bos_text,
        eos_text=chat.eos_text,
        add_bos=chat.add_bos,
        add_eos=chat.add_eos,
        now=chat.now or time.time(),
    ).to_text()


def _chat_settings(chat: ChatSettings, compiled: CompiledConstraint, prefill: bytes) -> pb.ChatSettings:
    patterns, tokens = chat_triggers(chat.trigger_words, chat.preserved_tokens, compiled.grammar.vocab)
    return pb.ChatSettings(
        prompt=chat.prompt,
        generation_prompt=chat.generation_prompt,
        grammar=chat.grammar,
        grammar_lazy=chat.grammar_lazy,
        trigger_patterns=[*patterns, *chat.trigger_patterns],
        trigger_tokens=tokens,
        preserved_tokens=chat.preserved_tokens,
        additional_stops=chat.additional_stops,
        supports_thinking=chat.supports_thinking,
        thinking_start_tag=chat.thinking_start_tag,
        thinking_end_tags=chat.thinking_end_tags,
        prefill=chat.prefill + prefill,
        parser=chat.parser,
    )


# CreateSession's `constraint` field -> (kind, its text and start symbol in the request)
_CONSTRAINT_FIELDS: dict[str, tuple[ConstraintKind, Callable[[pb.CreateSessionRequest], tuple[str, str]]]] = {
    "gbnf": (ConstraintKind.GBNF, lambda r: (r.gbnf.text, r.gbnf.root or "root")),
    "json_schema": (ConstraintKind.JSON_SCHEMA, lambda r: (r.json_schema, "root")),
    "json_object": (ConstraintKind.JSON_OBJECT, lambda r: ("", "root")),
    "openai_request": (ConstraintKind.OPENAI_REQUEST, lambda r: (r.openai_request, "root")),
    "ollama_request": (ConstraintKind.OLLAMA_REQUEST, lambda r: (r.ollama_request, "root")),
    "chat": (ConstraintKind.CHAT, lambda r: (_chat_text(r), "root")),
}


class Operations:
    """The RPCs over one registry and one session store."""

    def __init__(self, registry: Registry, store: SessionStore, limits: Limits) -> None:
        self.registry = registry
        self.store = store
        self._limits = limits
        self._wire_masks = WireMasks()  # the masks answered lately, in their wire form
        # the registry releases only vocabularies no open session of this store uses
        registry.watch_sessions(store.uses_vocab)
        # a Step operation's kind -> what answers it into its result's field of that kind, returning the
        # work it owes (the reply is the result's own field: nothing is made, copied and pointed into again)
        self._step_ops: dict[str, Callable[[Any, Any], Sequence[Owed]]] = {
            "accept": self._accept_into,
            "mask": self._mask_into,
            "allows": self._allows_into,
        }

    def record_bounds(self) -> dict[str, tuple[int, Callable[[], Exception]]]:
        """The most records (values, of a packed number) a request may hold of some fields, by the field's
        full name, each with the error past it: what a reader of a large request (server/large.py) checks as
        it goes, so a vocabulary of ten million pieces is refused after a million, not read whole first,
        and ten million token ids before one is decoded."""
        most = self._limits.max_vocab_size

        def too_many() -> Exception:
            return LimitError(f"a vocabulary of more than {most} tokens is over the limit of {most}")

        pieces = pb.PieceList.DESCRIPTOR.fields_by_name
        bounds = {pieces[name].full_name: (most, too_many) for name in ("pieces", "token_texts")}
        tokens = self._limits.max_tokens_per_call

        def too_many_tokens() -> Exception:
            return LimitError(f"more than {tokens} token ids are over the limit of {tokens} token ids a call")

        for field in (
            pb.AllowsRequest.DESCRIPTOR.fields_by_name["tokens"],  # an Allows, and Step's together
            pb.CreateSessionRequest.DESCRIPTOR.fields_by_name["replay"],
            pb.SessionOptions.DESCRIPTOR.fields_by_name["trigger_tokens"],
        ):
            bounds[field.full_name] = (tokens, too_many_tokens)
        return bounds

    def check_vocab_bytes(self, size: int) -> None:
        """Refuses a vocabulary sent in parts (RegisterVocabParts) whose parts so far are `size` bytes
        together, once that passes `max_vocab_bytes`.

        Raises:
            LimitError: past the limit.
        """
        most = self._limits.max_vocab_bytes
        if size > most:
            raise LimitError(f"a vocabulary sent in parts over {most} bytes is over the limit of {most}")

    def register_vocab(self, request: pb.RegisterVocabRequest) -> pb.RegisterVocabResponse:
        """RegisterVocab; slow for a large vocabulary (the server runs it in a worker thread)."""
        source = request.WhichOneof("source")
        if source == "gguf_path":
            vocab = self.registry.register_gguf(request.gguf_path)
        elif source == "pieces":
            given = request.pieces
            # counted before any piece becomes a Python object: a refused vocabulary costs its message only
            self.registry.check_size(max(len(given.pieces), len(given.token_texts), len(given.token_attrs)))
            tokenizer = None
            if given.HasField("tokenizer") and given.tokenizer.model:
                tokenizer = TokenizerRules(
                    given.tokenizer.model,
                    given.tokenizer.add_space_prefix,
                    given.tokenizer.escape_whitespaces,
                )
            vocab = self.registry.register_pieces(
                list(given.pieces),
                list(given.eog),
                token_texts=list(given.token_texts) or None,
                token_attrs=list(given.token_attrs) or None,
                tokenizer=tokenizer,
            )
        else:
            raise InputError("RegisterVocab needs `pieces` or `gguf_path`")
        return pb.RegisterVocabResponse(
            vocab_id=vocab.content_hash, size=len(vocab), content_hash=vocab.content_hash
        )

    def plan_session(self, request: pb.CreateSessionRequest) -> SessionPlan:
        """Checks and decodes a CreateSession request; finds its compiled constraint when cached. Fast."""
        field = request.WhichOneof("constraint")
        if field is None:
            raise InputError("CreateSession needs a constraint: " + ", ".join(_CONSTRAINT_FIELDS))
        kind, read = _CONSTRAINT_FIELDS[field]
        text, root = read(request)
        options = request.options
        limits = self._limits
        # literal patterns (trigger words) are one automaton, sized by the grammar's bytes; the others
        # each run after every token a waiting grammar accepts
        searched = sum(literal_of(pattern) is None for pattern in options.trigger_patterns)
        if searched > limits.max_trigger_patterns:
            raise LimitError(
                f"{searched} trigger patterns that are not literal words are over the limit of "
                f"{limits.max_trigger_patterns}"
            )
        self._check_tokens(len(options.trigger_tokens), "trigger tokens")
        if kind is ConstraintKind.CHAT and (options.trigger_patterns or options.trigger_tokens):
            raise InputError("a chat request brings its own triggers: give no options.trigger_patterns or "
                             "options.trigger_tokens with it")
        self._check_tokens(len(request.replay), "replayed tokens")
        constraint = Constraint(
            kind,
            text,
            root=root,
            trigger_patterns=tuple(options.trigger_patterns),
            trigger_tokens=tuple(options.trigger_tokens),
            strict=request.strict,
            dialect=request.schema_dialect or DEFAULT_DIALECT,
        )
        check_dialect(constraint.dialect)  # before any work: an unknown name is the caller's mistake
        constraint.check_size(limits.max_grammar_bytes)
        # the patterns are part of the grammar's size: each is compiled, and looked for after every token
        patterns = sum(len(p.encode("utf-8", "surrogatepass")) for p in constraint.trigger_patterns)
        if patterns and len(text.encode("utf-8", "surrogatepass")) + patterns > limits.max_grammar_bytes:
            raise LimitError(
                f"the {kind.value} and its trigger patterns ({patterns} bytes) are over the limit of "
                f"{limits.max_grammar_bytes} bytes"
            )
        if len(options.prefill) > self._limits.max_prefill_bytes:
            raise LimitError(
                f"a prefill of {len(options.prefill)} bytes is over the limit of "
                f"{self._limits.max_prefill_bytes}"
            )
        vocab = self.registry.vocab(request.vocab_id)
        for token in constraint.trigger_tokens:
            if not 0 <= token < len(vocab):
                raise TokenError(f"trigger token {token} is outside the vocabulary of {len(vocab)}")
        return SessionPlan(
            vocab_id=request.vocab_id,
            constraint=constraint,
            ttl=float(options.ttl_seconds),
            prefill=bytes(options.prefill),
            replay=request.replay,
            compiled=self.registry.cached(constraint, vocab),
        )

    def compile(self, plan: SessionPlan) -> CompiledConstraint:
        """The plan's compiled constraint, compiled now if not cached (slow: a worker thread's job)."""
        if plan.compiled is not None:
            return plan.compiled
        return self.registry.compile(plan.constraint, self.registry.vocab(plan.vocab_id))

    def start(
        self, plan: SessionPlan, compiled: CompiledConstraint, *, deadline: float | None = None
    ) -> Matcher:
        """The planned session's matcher past its prefill and replay (slow for a long replay: a worker
        thread's job; it touches no shared state). A replay still running at `deadline` (time.monotonic())
        stops with DeadlineError. A chat request's prefill (its generation prompt) comes before the plan's."""
        prefill = plan.prefill if compiled.chat is None else compiled.chat.prefill + plan.prefill
        return self.store.start(compiled, prefill=prefill, replay=plan.replay, deadline=deadline)

    def open_session(
        self, plan: SessionPlan, compiled: CompiledConstraint, started: Matcher | None = None
    ) -> pb.CreateSessionResponse:
        """Opens the planned session on its compiled constraint (and on its started matcher, if given)."""
        matcher = started if started is not None else self.start(plan, compiled)
        session = self.store.adopt(compiled, matcher, ttl=plan.ttl, replayed=len(plan.replay))
        reply = pb.CreateSessionResponse(
            session_id=session.id,
            warnings=compiled.warnings,
            state=_state(session),
            vocab_size=len(compiled.grammar.vocab),
        )
        if compiled.chat is not None:
            reply.chat.CopyFrom(_chat_settings(compiled.chat, compiled, plan.prefill))
        return reply

    def create_session(self, request: pb.CreateSessionRequest) -> pb.CreateSessionResponse:
        """CreateSession in one go (plan, compile, open), for callers with no event loop to keep free."""
        plan = self.plan_session(request)
        return self.open_session(plan, self.compile(plan))

    def accept(self, request: pb.AcceptRequest) -> pb.AcceptResponse:
        reply, owed = self.accept_owing(request)
        pay(owed)
        return reply

    def accept_owing(self, request: pb.AcceptRequest) -> tuple[pb.AcceptResponse, list[Owed]]:
        reply = pb.AcceptResponse()
        return reply, list(self._accept_into(request, reply))

    def _accept_into(self, request: pb.AcceptRequest, reply: pb.AcceptResponse) -> Sequence[Owed]:
        session = self.store.get(request.session_id, position=_position(request))
        accepted = session.accept(request.token)
        reply.accepted = accepted
        _set_state(reply.state, session)
        if request.mask_after:
            return (OwedMask(reply.mask, session.matcher.fork(), self._wire_masks, compact=True),)
        if not accepted and request.mask_on_reject:
            return (OwedMask(reply.mask, session.matcher.fork(), self._wire_masks),)
        return ()

    def allows(self, request: pb.AllowsRequest) -> pb.AllowsResponse:
        reply, owed = self.allows_owing(request)
        pay(owed)
        return reply

    def allows_owing(self, request: pb.AllowsRequest) -> tuple[pb.AllowsResponse, list[Owed]]:
        """Allows with the session's state now and the checks owed, on a fork of the session's matcher (up to
        `max_tokens_per_call` checks is seconds of work: a worker thread's, while the session goes on)."""
        reply = pb.AllowsResponse()
        return reply, list(self._allows_into(request, reply))

    def _allows_into(self, request: pb.AllowsRequest, reply: pb.AllowsResponse) -> Sequence[Owed]:
        self._check_tokens(len(request.tokens), "tokens to check")
        session = self.store.get(request.session_id)
        _set_state(reply.state, session)
        return (OwedChecks(reply, session.matcher.fork(), request.tokens),)

    def mask(self, request: pb.MaskRequest) -> pb.MaskResponse:
        reply, owed = self.mask_owing(request)
        pay(owed)
        return reply

    def mask_owing(self, request: pb.MaskRequest) -> tuple[pb.MaskResponse, list[Owed]]:
        reply = pb.MaskResponse()
        return reply, list(self._mask_into(request, reply))

    def _mask_into(self, request: pb.MaskRequest, reply: pb.MaskResponse) -> Sequence[Owed]:
        session = self.store.get(request.session_id)
        _set_state(reply.state, session)
        return (OwedMask(reply.mask, session.matcher.fork(), self._wire_masks),)

    def rollback(self, request: pb.RollbackRequest) -> pb.RollbackResponse:
        session = self.store.get(request.session_id, position=_position(request))
        session.rollback(request.count)
        return pb.RollbackResponse(state=_state(session))

    def fork(self, request: pb.ForkRequest) -> pb.ForkResponse:
        child = self.store.fork(request.session_id, position=_position(request))
        return pb.ForkResponse(session_id=child.id, state=_state(child))

    def close(self, request: pb.CloseRequest) -> pb.CloseResponse:
        self.store.close(request.session_id)
        return pb.CloseResponse()

    def step(self, request: pb.StepRequest) -> pb.StepResponse:
        reply, owed = self.step_owing(request)
        pay(owed)
        return reply

    def step_owing(self, request: pb.StepRequest) -> tuple[pb.StepResponse, list[Owed]]:
        """One Step message: every operation in order, each failure answered in its place."""
        slices = self.step_slices(request)
        while True:
            try:
                next(slices)
            except StopIteration as done:
                answer: tuple[pb.StepResponse, list[Owed]] = done.value
                return answer

    def step_slices(
        self, request: pb.StepRequest, *, tally: StepTally | None = None
    ) -> Generator[None, None, tuple[pb.StepResponse, list[Owed]]]:
        """`step_owing` as a generator that stops after every STEP_SLICE operations (and accepts of the
        batch), returning what `step_owing` returns. A caller may run other operations between two slices:
        each operation is done whole, in order, as if the message came in parts. `tally` is told what the
        message asks for, then each error answered in an operation's place, as it is answered."""
        ops = request.ops
        batch = request.accepts
        batched = len(batch.session_ids)
        kinds = [op.WhichOneof("op") for op in ops]
        if tally is not None:
            for kind in kinds:
                tally.asked(kind or "none", 1)
            if batched:
                tally.asked("accept", batched)
        count = len(kinds) + batched
        if count > self._limits.max_step_ops:
            raise LimitError(
                f"a Step message of {count} operations is over the limit of {self._limits.max_step_ops}"
            )
        if "allows" in kinds:
            # every Allows of the message together: 4096 operations of a million tokens each is not one call
            self._check_tokens(
                sum(len(op.allows.tokens) for op, kind in zip(ops, kinds, strict=True) if kind == "allows"),
                "tokens to check in a Step message",
            )
        reply = pb.StepResponse()
        results = reply.results
        owed: list[Owed] = []
        step_ops = self._step_ops
        for done, (op, kind) in enumerate(zip(ops, kinds, strict=True), 1):
            if not done % STEP_SLICE:
                yield
            result = results.add()
            try:
                if kind is None:
                    raise InputError("a Step operation needs `accept`, `mask` or `allows`")
                owes = step_ops[kind](getattr(op, kind), getattr(result, kind))
            except ConstraintdError as error:
                status = status_for(error)
                result.error.CopyFrom(status)
                if tally is not None:
                    tally.failed(kind or "none", status.code)
            else:
                if owes:
                    owed.extend(owes)
        if batched:
            yield from self._accept_batch(batch, reply.accepts, owed, tally)
        return reply, owed

    def _check_tokens(self, count: int, what: str) -> None:
        # before any work on them: a call of ten million token ids would hold the event loop for seconds
        if count > self._limits.max_tokens_per_call:
            raise LimitError(
                f"{count} {what} are over the limit of {self._limits.max_tokens_per_call} token ids a call"
            )

    def _accept_batch(
        self,
        batch: pb.AcceptBatch,
        into: pb.AcceptBatchResponse,
        owed: list[Owed],
        tally: StepTally | None,
    ) -> Generator[None, None, None]:
        """A Step's accept batch, column in, column out: the hot path of a worker decoding many sequences,
        so it makes no message per item (only per error and per owed mask). Stops after every STEP_SLICE
        accepts, as `step_slices`."""
        count = len(batch.session_ids)
        # the columns' lengths are checked before they are copied: `count` is bounded by max_step_ops
        if len(batch.tokens) != count or len(batch.positions) not in (0, count):
            raise InputError(
                f"an accept batch of {count} sessions has {len(batch.tokens)} tokens and "
                f"{len(batch.positions)} positions (one each, or no positions)"
            )
        ids = list(batch.session_ids)
        tokens = list(batch.tokens)
        positions: list[int | None] = list(batch.positions) or [None] * count
        accepted = [False] * count  # an item that fails stays False in both columns
        complete = [False] * count
        get = self.store.get
        wire = self._wire_masks
        now = self.store.now()  # one moment for the whole message
        mask_after = batch.mask_after
        owe_rejected = batch.mask_on_reject and not mask_after
        for index in range(count):
            if index and not index % STEP_SLICE:
                yield
            try:
                session = get(ids[index], position=positions[index], now=now)
                taken = session.accept(tokens[index])
            except ConstraintdError as error:
                status = status_for(error)
                into.errors.add(index=index, error=status)
                if tally is not None:
                    tally.failed("accept", status.code)
                continue
            matcher = session.matcher
            accepted[index] = taken
            complete[index] = matcher.is_complete()
            if mask_after:
                owed.append(OwedMask(into.masks.add(index=index).mask, matcher.fork(), wire, compact=True))
            elif not taken and owe_rejected:
                owed.append(OwedMask(into.masks.add(index=index).mask, matcher.fork(), wire))
        into.accepted.extend(accepted)
        into.complete.extend(complete)
