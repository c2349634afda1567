"""The blocking client (clients/client.py) in-process and over a real server (Unix socket, TCP), including
transparent recovery when sessions expire and when the server is killed and restarted mid-generation."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clients import Client, ClientTls, Policy, ServiceError, Session
from constraintd.engine.grammar.compiled import Grammar
from constraintd.engine.masks.bitmask import allocate_masks
from constraintd.engine.matcher import Matcher
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import (
    ConstraintdError,
    DeadlineError,
    GrammarError,
    InputError,
    NotFoundError,
    SchemaError,
    TokenError,
    VocabError,
)
from constraintd.server.config import TlsFiles
from constraintd.server.lifecycle import Service
from constraintd.service.limits import Limits
from tests import reference
from tests.clients.generation import SCHEMA, generate
from tests.server.running import (
    AB_PLUS,
    EOS,
    TINY_EOG,
    TINY_PIECES,
    ServerProcess,
    ServerThread,
    client_of,
    server_config,
    socket_dir,
)
from tests.server.test_lifecycle import make_certificates

A, B, AB = 3, 4, 10
POLICY = Policy(timeout=30.0, setup_timeout=60.0)


def engine_mask(tokens: list[int]) -> np.ndarray:
    matcher = Matcher(Grammar.from_gbnf(AB_PLUS, Vocab(TINY_PIECES, TINY_EOG)))
    for token in tokens:
        assert matcher.accept(token)
    return np.asarray(matcher.mask())


@pytest.fixture(params=["local", "unix", "tcp"])
def client(request: pytest.FixtureRequest) -> Iterator[Client]:
    with client_of(request.param, POLICY) as opened:
        yield opened


def test_every_session_call(client: Client) -> None:
    vocab = client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
    assert vocab.size == len(TINY_PIECES) and vocab.id == Vocab(TINY_PIECES, TINY_EOG).content_hash
    with client.session(vocab, gbnf=AB_PLUS) as session:
        assert np.array_equal(session.mask(), engine_mask([]))
        assert session.allows(A) and not session.allows(B)
        assert session.allows_all([A, B, AB, EOS]) == [True, False, True, False]
        assert not session.accept(B)
        mask = session.accept_or_mask(B)
        assert mask is not None and np.array_equal(mask, engine_mask([]))
        assert session.accept_or_mask(A) is None
        assert not session.is_complete()
        assert session.accept(B) and session.is_complete()
        assert session.history == (A, B)
        fork = session.fork()
        assert fork.id != session.id and fork.history == (A, B)
        session.rollback(1)
        assert session.history == (A,) and not session.is_complete()
        assert np.array_equal(session.mask(), engine_mask([A]))
        assert fork.accept(EOS) and fork.history == (A, B, EOS)
        fork.close()
        fork.close()  # twice is fine
        with pytest.raises(NotFoundError):
            fork.mask()
    with pytest.raises(NotFoundError):
        session.accept(B)


def test_a_step_batch_over_many_sessions(client: Client) -> None:
    vocab = client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
    sessions = [client.session(vocab, gbnf=AB_PLUS) for _ in range(5)]
    first = client.step([(s, A) for s in sessions[:4]] + [(sessions[4], None)])
    assert [o.accepted for o in first] == [True] * 4 + [None]
    assert first[4].mask is not None and np.array_equal(first[4].mask, engine_mask([]))
    second = client.step([(s, token) for s, token in zip(sessions, [B, A, B, EOS, AB], strict=True)])
    assert [o.accepted for o in second] == [True, False, True, False, True]
    assert second[1].mask is not None and np.array_equal(second[1].mask, engine_mask([A]))
    assert [o.complete for o in second] == [True, False, True, False, True]
    assert [s.history for s in sessions] == [(A, B), (A,), (A, B), (A,), (AB,)]


def test_accept_and_mask_answers_the_next_mask_in_one_call(client: Client) -> None:
    vocab = client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
    with client.session(vocab, gbnf=AB_PLUS) as session:
        taken, mask = session.accept_and_mask(B)
        assert not taken and np.array_equal(mask, engine_mask([])) and session.history == ()
        taken, mask = session.accept_and_mask(A)
        assert taken and np.array_equal(mask, engine_mask([A])) and session.history == (A,)
    with client.session(vocab, gbnf=AB_PLUS, trigger_tokens=[AB]) as lazy:
        taken, mask = lazy.accept_and_mask(B)  # before the trigger every token is allowed
        assert taken and np.array_equal(mask, allocate_masks(1, len(TINY_PIECES))[0])
    sessions = [client.session(vocab, gbnf=AB_PLUS) for _ in range(3)]
    outcomes = client.step([(s, t) for s, t in zip(sessions, [A, B, AB], strict=True)], mask_after=True)
    assert [o.accepted for o in outcomes] == [True, False, True]
    expected = [engine_mask([A]), engine_mask([]), engine_mask([AB])]
    for outcome, mask in zip(outcomes, expected, strict=True):
        assert outcome.mask is not None and np.array_equal(outcome.mask, mask)


BOUNDED_NUMBER = {"type": "object", "properties": {"x": {"type": "number", "minimum": 1}}}


def test_strict_refuses_a_schema_the_grammar_cannot_enforce_and_otherwise_it_is_reported(
    client: Client,
) -> None:
    vocab = client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
    with client.session(vocab, json_schema=BOUNDED_NUMBER) as lenient:
        assert any("/properties/x/minimum" in warning for warning in lenient.warnings)
    with pytest.raises(SchemaError) as refused:
        client.session(vocab, json_schema=BOUNDED_NUMBER, strict=True)
    assert refused.value.pointer == "#/properties/x/minimum"
    assert "minimum" in str(refused.value)
    request = {"messages": [], "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": BOUNDED_NUMBER}}}
    with pytest.raises(SchemaError):
        client.session(vocab, openai_request=request, strict=True)
    with client.session(vocab, json_schema={"type": "object"}, strict=True) as enforced:
        assert enforced.warnings == ()


def test_the_extended_dialect_enforces_what_llama_cpps_leaves_out(client: Client) -> None:
    vocab = client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
    number = {"type": "integer", "minimum": 100}
    at_least_100 = {"type": "object", "properties": {"n": number}, "required": ["n"]}
    with client.session(vocab, json_schema=at_least_100) as llama_cpps:
        assert any("/properties/n/minimum" in warning for warning in llama_cpps.warnings)
    with pytest.raises(SchemaError):
        client.session(vocab, json_schema=at_least_100, strict=True)
    with client.session(vocab, json_schema=at_least_100, dialect="extended", strict=True) as extended:
        assert extended.warnings == ()
    with pytest.raises(SchemaError, match="unknown schema dialect"):
        client.session(vocab, json_schema=at_least_100, dialect="llama.cpp-and-more")


def test_every_kind_of_constraint(client: Client) -> None:
    vocab = client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
    schema = {"type": "string", "pattern": "x"}
    kinds = {
        "json_schema": client.session(vocab, json_schema=schema),
        "json_schema_text": client.session(vocab, json_schema='{"type": "object"}'),
        "json_object": client.session(vocab, json_object=True),
        "openai": client.session(vocab, openai_request={"response_format": {"type": "json_object"}}),
        "ollama": client.session(vocab, ollama_request={"format": schema}),
        "gbnf": client.session(vocab, gbnf='start ::= "{" "}"', root="start"),
        "prefill": client.session(vocab, gbnf=AB_PLUS, prefill="a"),
        "lazy": client.session(vocab, gbnf='root ::= "1" "a"', trigger_tokens=[8]),
    }
    quote, brace = TINY_PIECES.index(b'"'), TINY_PIECES.index(b"{")
    assert kinds["json_schema"].allows(quote) and kinds["ollama"].allows(quote)
    assert kinds["json_schema"].warnings == (
        "pattern x is not supported (not anchored with '^' and '$'), accepting any string",
    )
    for name in ("json_schema_text", "json_object", "openai", "gbnf"):
        assert kinds[name].allows(brace) and not kinds[name].allows(quote)
    assert kinds["prefill"].accept(B) and kinds["prefill"].is_complete()
    assert kinds["lazy"].accept(EOS) and kinds["lazy"].accept(8)
    assert kinds["lazy"].allows(A) and not kinds["lazy"].allows(B)


def test_misuse_and_refusals_raise(client: Client) -> None:
    vocab = client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
    with pytest.raises(ValueError, match="exactly one of gbnf="):
        client.session(vocab, gbnf=AB_PLUS, json_object=True)
    with pytest.raises(ValueError, match="exactly one of gbnf="):
        client.session(vocab)
    with pytest.raises(ValueError, match="exactly one of gguf=, vocab=, pieces="):
        client.register_vocab()
    with pytest.raises(GrammarError, match="line 1, column"):
        client.session(vocab, gbnf='root ::= "a')
    with pytest.raises(SchemaError, match="#/properties/a"):
        client.session(vocab, json_schema={"properties": {"a": {"$ref": "#/nowhere"}}})
    session = client.session(vocab, gbnf=AB_PLUS)
    with pytest.raises(TokenError, match="token 99 is outside the vocabulary of 20"):
        session.accept(99)
    with pytest.raises(ValueError, match="cannot roll back 1 tokens of 0"):
        session.rollback(1)
    # a handle the server does not know (say, from before a restart) is registered again on the way
    assert client.session(dataclasses.replace(vocab, id="unknown"), gbnf=AB_PLUS).accept(A)


# What a refusal is to its caller: its class, its message (with the session's id, which differs from one
# client to another, taken out) and its attributes (a GrammarError's line, column, excerpt; a SchemaError's
# pointer).
Refusal = tuple[type[ConstraintdError], str, dict[str, Any]]


def refusal(error: ConstraintdError, session_id: str) -> Refusal:
    return type(error), str(error).replace(session_id, "<id>"), vars(error)


def refusals(client: Client) -> dict[str, Refusal]:
    """Every kind of refusal `client` raises: unary calls, then Step results (over gRPC an Accept goes as a
    Step of one accept, and `step` sends ops and an accept batch)."""
    vocab = client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
    session = client.session(vocab, gbnf=AB_PLUS)
    closed = client.session(vocab, gbnf=AB_PLUS)
    closed.close()
    attempts = {
        "grammar": lambda: client.session(vocab, gbnf='root ::= "a'),
        "schema": lambda: client.session(vocab, json_schema={"properties": {"a": {"$ref": "#/nowhere"}}}),
        "vocab": lambda: client.register_vocab(pieces=TINY_PIECES, eog=[999]),
        "allows": lambda: session.allows(99),
        "mask-closed": lambda: closed.mask(),
        "accept": lambda: session.accept(99),
        "step-accept": lambda: client.step([(session, 99)]),
        "step-mask-closed": lambda: client.step([(closed, None)]),
    }
    caught: dict[str, Refusal] = {}
    for name, attempt in attempts.items():
        with pytest.raises(ConstraintdError) as raised:
            attempt()
        caught[name] = refusal(raised.value, closed.id)
    return caught


def test_a_refusal_raises_the_same_error_on_every_transport(client: Client) -> None:
    with Client("local", policy=POLICY) as local:
        in_process = refusals(local)
    assert {name: kind for name, (kind, _, _) in in_process.items()} == {
        "grammar": GrammarError,
        "schema": SchemaError,
        "vocab": VocabError,
        "allows": TokenError,
        "mask-closed": NotFoundError,
        "accept": TokenError,
        "step-accept": TokenError,
        "step-mask-closed": NotFoundError,
    }
    assert in_process["grammar"][2]["line"] == 1 and in_process["schema"][2]["pointer"] == "#/properties/a"
    assert refusals(client) == in_process


def test_a_gguf_path_a_vocab_and_its_pieces_give_one_id(client: Client) -> None:
    path = reference.require(reference.vocab_path("llama-spm"))
    by_path = client.register_vocab(gguf=path)
    local = Vocab.from_gguf(path)
    by_vocab = client.register_vocab(vocab=local)
    assert by_path.id == by_vocab.id == local.content_hash and by_path.size == 32000
    by_pieces = client.register_vocab(pieces=local.pieces, eog=sorted(local.eog_ids))
    assert by_pieces.id != by_path.id  # no token texts: another vocabulary


def test_a_vocabulary_over_one_message_is_registered_in_parts(client: Client) -> None:
    # Gemma 3's vocabulary is about 5.4 MiB as one request, over a server's 4 MiB
    local = Vocab.from_gguf(reference.gemma_path())
    assert len(local.pieces) == 262_144
    handle = client.register_vocab(vocab=local)
    assert handle.id == local.content_hash and handle.size == 262_144


def test_an_expired_session_is_rebuilt_where_it_was() -> None:
    now = [0.0]
    limits = dataclasses.replace(Limits(), default_ttl=10.0)
    with socket_dir() as directory:
        server = ServerThread(server_config(directory, limits=limits), clock=lambda: now[0])
        service = server.start()
        try:
            with Client(service.addresses[0], policy=POLICY) as client:
                vocab = client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
                session = client.session(vocab, gbnf=AB_PLUS, prefill=b"a")
                assert session.accept(B)
                lost = session.id
                now[0] = 100.0
                assert service.reclaim_idle() == 1
                assert session.accept(B)  # rebuilt from its tokens, then accepted
                assert session.id != lost and session.history == (B, B)
                assert np.array_equal(session.mask(), engine_mask([A, B, B]))
        finally:
            server.stop()


@pytest.mark.slow
def test_a_server_killed_and_restarted_mid_generation_changes_no_token() -> None:
    """40 seeded steps through a JSON schema over llama-spm (32,000 tokens); the server is killed (SIGKILL) at
    step 15 and a new one started on the same socket; the client rides it out (re-registering the vocabulary
    from its GGUF path, rebuilding the session by replay) and ends with the tokens of an uninterrupted run."""
    path = reference.require(reference.vocab_path("llama-spm"))
    eog = frozenset(Vocab.from_gguf(path).eog_ids)
    with Client("local") as local:
        reference_run = generate(
            local.session(local.register_vocab(gguf=path), json_schema=SCHEMA), seed=7, steps=40, eog=eog
        )
    with socket_dir() as directory:
        servers = [ServerProcess(directory / "s.sock").start()]

        def kill_and_restart(step: int) -> None:
            if step == 15:
                servers[-1].kill()
                servers.append(ServerProcess(directory / "s.sock").launch())

        try:
            with Client(servers[0].target, policy=POLICY) as client:
                session = client.session(client.register_vocab(gguf=path), json_schema=SCHEMA)
                first_id = session.id
                tokens = generate(session, seed=7, steps=40, eog=eog, before_step=kill_and_restart)
                assert session.id != first_id  # it was rebuilt on the new server
        finally:
            for server in servers:
                server.kill()
    assert len(servers) == 2
    assert len(tokens) > 15
    assert tokens == reference_run


def test_a_bearer_token_and_tls(tmp_path: Path) -> None:
    files = make_certificates(tmp_path)
    tls = TlsFiles(files["server.pem"], files["server.key"], files["ca.pem"])
    with socket_dir() as directory:
        config = server_config(directory, listen=("127.0.0.1:0",), tls=tls, bearer_token="s3cret")
        server = ServerThread(config)
        service = server.start()
        try:
            client_tls = ClientTls(
                ca=files["ca.pem"], cert=files["client.pem"], key=files["client.key"], server_name="localhost"
            )
            with Client(service.addresses[0], policy=POLICY, token="s3cret", tls=client_tls) as client:
                vocab = client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
                with client.session(vocab, gbnf=AB_PLUS) as session:
                    assert session.accept(A)
            with (
                Client(service.addresses[0], policy=POLICY, token="wrong", tls=client_tls) as client,
                pytest.raises(ServiceError, match="UNAUTHENTICATED: missing or wrong bearer token"),
            ):
                client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
        finally:
            server.stop()


def test_a_session_is_a_context_manager_and_the_client_too() -> None:
    with Client("local") as client:
        vocab = client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
        with client.session(vocab, gbnf=AB_PLUS) as session:
            assert isinstance(session, Session)
        assert session.record.closed


@pytest.fixture
def served() -> Iterator[Service]:
    with socket_dir() as directory:
        server = ServerThread(server_config(directory))
        try:
            yield server.start()
        finally:
            server.stop()


def test_accept_goes_over_a_step_stream_with_the_unary_answers(served: Service) -> None:
    with Client(served.addresses[0], policy=POLICY) as client:
        session = client.session(client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG), gbnf=AB_PLUS)
        assert session.accept(A) and not session.accept(A)
        mask = session.accept_or_mask(A)
        assert mask is not None and np.array_equal(mask, engine_mask([A]))
        with pytest.raises(InputError, match="outside the vocabulary"):
            session.accept(-5)
        assert session.history == (A,)
    assert served.metrics.step_ops.value("accept") == 4 and served.metrics.rpcs.value("Accept", "OK") == 0


def test_an_accept_past_its_deadline_is_a_deadline_error_and_the_next_one_works(
    served: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stops answering Step messages (its loop blocked) for longer than the call's deadline."""
    release = threading.Event()
    answer = served.operations.step_slices

    def stalled(request: Any, **options: Any) -> Any:
        release.wait(30.0)
        return answer(request, **options)

    with Client(served.addresses[0], policy=dataclasses.replace(POLICY, timeout=0.2)) as client:
        session = client.session(client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG), gbnf=AB_PLUS)
        assert session.accept(A)
        monkeypatch.setattr(served.operations, "step_slices", stalled)
        with pytest.raises(DeadlineError, match=r"no Step reply within 0\.2 s"):
            session.accept(B)
        monkeypatch.undo()
        release.set()
        assert session.accept(B) and session.history == (A, B)  # rebuilt if the stalled accept landed


def test_threads_sharing_a_client_accept_at_once(served: Service) -> None:
    """One thread holds the Accept stream while the others make unary calls; every answer is its own."""
    with Client(served.addresses[0], policy=POLICY) as client:
        vocab = client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
        sessions = [client.session(vocab, gbnf=AB_PLUS) for _ in range(4)]

        def generate_in(session: Session) -> list[bool]:
            return [session.accept(token) for token in (A, A, B, B, A)]

        with ThreadPoolExecutor(4) as pool:
            verdicts = list(pool.map(generate_in, sessions))
    assert verdicts == [[True, False, True, True, False]] * 4
    assert [s.history for s in sessions] == [(A, B, B)] * 4
