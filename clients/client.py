# The blocking client: `Client` and its `Session`s.
#
# Invariants:
# - This is a thin front-end: it drives the flows of clients/flows.py with blocking transport calls and
#   `time.sleep`; every decision (retries, rebuilding a lost session, what a reply does to a session's
#   record) is made in the flows, identically for `AsyncClient`.
# - No event loop is created or run here, and no thread is started (grpc's channel has its own).
# - A session's accepted tokens are kept by its record, so the session survives the server losing it.
from __future__ import annotations

import os
import time
from collections.abc import Sequence
from types import TracebackType
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from clients import flows
from clients.base import LOCAL, BaseClient, ClientTls, JsonText
from clients.chat import ChatRequest, ChatSettings
from clients.flows import Flow, Pause, Policy, SessionRecord, StepOutcome, VocabHandle
from clients.transports import MIB, GrpcTransport, LocalTransport, Transport
from constraintd.engine.chat.parsing.message_parser import ParsedMessage
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import ConstraintdError

__all__ = ["Client", "Session"]

T = TypeVar("T")
Mask = npt.NDArray[np.int32]



class Client(BaseClient):
    """A blocking client of constraintd, remote (a gRPC target) or in-process (`"local"`).

    Example:
        with Client("unix:///run/constraintd.sock") as client:
            vocab = client.register_vocab(gguf="/models/model.gguf")
            with client.session(vocab, json_schema={"type": "object"}) as session:
                if not session.accept(token):
                    logits = apply_mask(logits, session.mask())
    """

    def __init__(
        self,
        target: str = LOCAL,
        *,
        policy: Policy | None = None,
        token: str | None = None,
        tls: ClientTls | None = None,
        max_message_bytes: int = 64 * MIB,
        transport: Transport | None = None,
    ) -> None:
        """Opens a client.

        Args:
            target: "local" (the engine in this process), or a gRPC target: `unix:///path`, `host:port`.
            policy: deadlines and retries (`Policy()` by default).
            token: bearer token the server asks for.
            tls: TLS settings; None means plaintext.
            max_message_bytes: the largest message either way.
            transport: use this transport instead of one made from `target`.
        """
        super().__init__(target, policy=policy or Policy())
        if transport is None:
            if target == LOCAL:
                transport = LocalTransport()
            else:
                transport = GrpcTransport(target, tls=tls, token=token, max_message_bytes=max_message_bytes)
        self.transport = transport

    def drive(self, flow: Flow[T]) -> T:
        """Runs a flow to its end with blocking calls; what the flow returns, or the error it raises."""
        try:
            action = next(flow)
            while True:
                if isinstance(action, Pause):
                    time.sleep(action.seconds)
                    action = flow.send(None)
                    continue
                try:
                    reply = self.transport.call(action.method, action.request, timeout=action.timeout)
                except ConstraintdError as error:
                    action = flow.throw(error)
                else:
                    action = flow.send(reply)
        except StopIteration as stop:
            result: T = stop.value
            return result

    def register_vocab(
        self,
        *,
        gguf: str | os.PathLike[str] | None = None,
        vocab: Vocab | None = None,
        pieces: Sequence[bytes] | None = None,
        eog: Sequence[int] = (),
        token_texts: Sequence[str] | None = None,
    ) -> VocabHandle:
        """Registers a vocabulary (idempotent: the same content gets the same id).

        Args:
            gguf: a GGUF file the *server* reads (the in-process transport: this process).
            vocab: a `Vocab` read here, sent token by token (over gRPC, a registration over 256 KiB
                goes in parts of 256 KiB, RegisterVocabParts: a server takes requests of 4 MiB by default).
            pieces: the piece bytes of every token, sent token by token, with `eog` and `token_texts`.

        Raises:
            ValueError: not exactly one of gguf, vocab, pieces.
            VocabError, InputError: the server cannot read or use the vocabulary.
            LimitError: the vocabulary is larger than the server allows, or it holds too many.
        """
        registration = self._registration(
            gguf=gguf, vocab=vocab, pieces=pieces, eog=eog, token_texts=token_texts
        )
        return self.drive(flows.register(self.policy, registration))

    def session(
        self,
        vocab: VocabHandle,
        *,
        gbnf: str | None = None,
        root: str = "root",
        json_schema: JsonText | None = None,
        json_object: bool = False,
        openai_request: JsonText | None = None,
        ollama_request: JsonText | None = None,
        trigger_patterns: Sequence[str] = (),
        trigger_tokens: Sequence[int] = (),
        prefill: str | bytes = b"",
        ttl: float | None = None,
        strict: bool = False,
        dialect: str = "llama.cpp",
        chat: ChatRequest | None = None,
    ) -> Session:
        """Opens a session over one constraint (exactly one of gbnf, json_schema, json_object,
        openai_request, ollama_request, chat).

        Args:
            vocab: a registered vocabulary.
            gbnf: a GBNF grammar; `root` names its start symbol.
            json_schema: a JSON schema (text, or a dict to be dumped).
            json_object: any JSON object (JSON mode).
            openai_request: an OpenAI chat request body (text or dict); its response_format decides.
            ollama_request: an Ollama request body; its format decides.
            chat: a chat request (template, messages, tools, tool_choice, ...), resolved by the service as
                llama-server resolves one: the session's grammar, its triggers and prefill are the chat
                params', and `Session.chat` holds the prompt, the stops and what `Session.parse` reads
                the answer with.
            trigger_patterns: make the grammar lazy, active once one of these patterns matches.
            trigger_tokens: make the grammar lazy, active once one of these tokens is accepted.
            prefill: text taken as generated already.
            ttl: idle seconds before the server reclaims the session (the client rebuilds it if used again).
            strict: refuse a JSON schema (given, or inside a request) that the grammar cannot enforce in
                full (SchemaError naming the keyword and its pointer); off, `Session.warnings` names what
                the grammar leaves unenforced.
            dialect: the JSON-schema converter's: "llama.cpp" (its grammar, byte for byte) or "extended"
                (enforces more keywords exactly; see constraintd/engine/schema/extended.py).

        Raises:
            ValueError: not exactly one constraint.
            InputError: a grammar, schema or request the server refuses (the message says where).
            LimitError, DeadlineError: the constraint is too large, or took too long to compile.
        """
        request = self._session_request(
            vocab,
            gbnf=gbnf,
            root=root,
            json_schema=json_schema,
            json_object=json_object,
            openai_request=openai_request,
            ollama_request=ollama_request,
            trigger_patterns=trigger_patterns,
            trigger_tokens=trigger_tokens,
            prefill=prefill,
            ttl=ttl,
            strict=strict,
            dialect=dialect,
            chat=chat,
        )
        record = SessionRecord(vocab, request)
        self.drive(flows.create(self.policy, record))
        return Session(self, record)

    def step(
        self,
        items: Sequence[tuple[Session, int | None]],
        *,
        mask_on_reject: bool = True,
        mask_after: bool = False,
    ) -> list[StepOutcome]:
        """Accepts a token in each of many sessions (token None: just its mask) in one Step message.

        With `mask_after`, each outcome holds the mask of its session's state after the accept (mask-ahead
        decoding for many generations; see `Session.accept_and_mask`).

        Raises:
            ValueError: a session appears twice.
        """
        batch = [(session.record, token) for session, token in items]
        return self.drive(
            flows.step(self.policy, batch, mask_on_reject=mask_on_reject, mask_after=mask_after)
        )

    def close(self) -> None:
        """Closes the transport (sessions stay on the server until closed or reclaimed)."""
        self.transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


class Session:
    """One generation's grammar state, held by the service; the client keeps its accepted tokens."""

    def __init__(self, client: Client, record: SessionRecord) -> None:
        self.client = client
        self.record = record

    @property
    def id(self) -> str:
        """The server's id of this session (changes when the client rebuilds a lost session)."""
        return self.record.id

    @property
    def history(self) -> tuple[int, ...]:
        """The tokens accepted so far."""
        return tuple(self.record.history)

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the schema conversion could not enforce."""
        return self.record.warnings

    @property
    def vocab(self) -> VocabHandle:
        return self.record.vocab

    @property
    def chat(self) -> ChatSettings | None:
        """What the service resolved the session's chat request to (None: the session was not made from
        one): the prompt, the stops, the preserved tokens, the triggers, the parser settings."""
        return self.record.chat

    def parse(self, text: str, *, partial: bool = False) -> ParsedMessage:
        """The message (content, reasoning_content, tool_calls) llama-server's chat parser reads in the
        generated `text`, through the engine's message parser in this process (no round trip); a text cut
        short keeps what was read. `partial`: the text so far of a stream, read as llama-server reads it
        (a text the format does not match yet is an empty message once the parse read past its start).

        Raises:
            ValueError: the session was not made from a chat request.
            MessageParseError: the text does not match the format.
            NotPorted: the format's parser is not ported.
        """
        if self.record.chat is None:
            raise ValueError("parse needs a session made from a chat request (chat=)")
        return self.record.chat.parse(text, partial=partial)

    def accept(self, token: int) -> bool:
        """Accepts the token if the grammar allows it; False (and no change) if not."""
        taken, _ = self.client.drive(
            flows.accept(self.client.policy, self.record, token, mask_on_reject=False)
        )
        return taken

    def accept_or_mask(self, token: int) -> Mask | None:
        """Accepts the token (None), or returns the mask if the grammar rejects it: one round trip."""
        taken, mask = self.client.drive(
            flows.accept(self.client.policy, self.record, token, mask_on_reject=True)
        )
        return None if taken else mask

    def accept_and_mask(self, token: int) -> tuple[bool, Mask]:
        """Accepts the token if the grammar allows it, and answers the mask of the state after the call (the
        new state; the unchanged one on a rejection), in one round trip.

        This is mask-ahead decoding: send the drawn token while the model evaluates it, and test the next
        draw against the mask with no round trip on the critical path. Each call costs a mask (from the
        grammar's cache for a state met before) and its bytes on the wire (none when every token is
        allowed).
        """
        return self.client.drive(flows.accept_ahead(self.client.policy, self.record, token))

    def allows(self, token: int) -> bool:
        """Whether the token may come next. Does not change the session."""
        return self.client.drive(flows.allows(self.client.policy, self.record, [token]))[0]

    def allows_all(self, tokens: Sequence[int]) -> list[bool]:
        """Whether each token may come next. Does not change the session."""
        return self.client.drive(flows.allows(self.client.policy, self.record, list(tokens)))

    def mask(self) -> Mask:
        """The packed mask of the tokens that may come next (int32 words). Does not change the session."""
        return self.client.drive(flows.mask(self.client.policy, self.record))

    def is_complete(self) -> bool:
        """Whether the grammar may end here (end-of-generation tokens allowed). No round trip."""
        return self.record.complete

    def rollback(self, count: int = 1) -> None:
        """Undoes the last `count` accepted tokens.

        Raises:
            ValueError: more tokens than were accepted.
            InputError: more than the server's rollback window keeps (its `max_rollback` last steps).
        """
        self.client.drive(flows.rollback(self.client.policy, self.record, count))

    def fork(self) -> Session:
        """A new session in the same state, independent from now on."""
        return Session(self.client, self.client.drive(flows.fork(self.client.policy, self.record)))

    def close(self) -> None:
        """Closes the session on the server (closing twice is fine)."""
        self.client.drive(flows.close(self.client.policy, self.record))

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
