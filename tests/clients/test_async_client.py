"""The asyncio client (clients/async_client.py) in-process and over a real grpc.aio server in the same event
loop: every call, many concurrent sessions, Step batches on one stream, and a server restarted while calls
are in flight."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from clients import AsyncClient, AsyncSession, Policy
from constraintd.engine.grammar.compiled import Grammar
from constraintd.engine.matcher import Matcher
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import (
    ConstraintdError,
    GrammarError,
    InputError,
    NotFoundError,
    SchemaError,
    TokenError,
    VocabError,
)
from constraintd.server.lifecycle import Service
from tests import reference
from tests.clients.generation import SCHEMA, generate_async
from tests.server.running import (
    AB_PLUS,
    EOS,
    TINY_EOG,
    TINY_PIECES,
    running_service,
    server_config,
    socket_dir,
)

A, B, AB = 3, 4, 10
POLICY = Policy(timeout=30.0, setup_timeout=60.0)


def engine_mask(tokens: list[int]) -> np.ndarray:
    matcher = Matcher(Grammar.from_gbnf(AB_PLUS, Vocab(TINY_PIECES, TINY_EOG)))
    for token in tokens:
        assert matcher.accept(token)
    return np.asarray(matcher.mask())


@pytest_asyncio.fixture(params=["local", "unix", "tcp"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[AsyncClient]:
    if request.param == "local":
        async with AsyncClient("local", policy=POLICY) as local:
            yield local
        return
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory)) as service,
            AsyncClient(service.addresses[0 if request.param == "unix" else 1], policy=POLICY) as remote,
        ):
            yield remote


@pytest.mark.asyncio
async def test_every_session_call(client: AsyncClient) -> None:
    vocab = await client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
    async with await client.session(vocab, gbnf=AB_PLUS) as session:
        assert isinstance(session, AsyncSession)
        assert np.array_equal(await session.mask(), engine_mask([]))
        assert await session.allows(AB) and not await session.allows(B)
        assert await session.allows_all([A, B, EOS]) == [True, False, False]
        rejected = await session.accept_or_mask(B)
        assert rejected is not None and np.array_equal(rejected, engine_mask([]))
        assert await session.accept(A) and await session.accept(B)
        assert session.is_complete() and session.history == (A, B)
        fork = await session.fork()
        await session.rollback(2)
        assert session.history == () and not session.is_complete()
        assert await fork.accept(EOS) and fork.history == (A, B, EOS)
        await fork.close()
        with pytest.raises(NotFoundError):
            await fork.accept(B)
        with pytest.raises(InputError, match="outside the vocabulary"):
            await session.accept(-5)
    assert session.record.closed


@pytest.mark.asyncio
async def test_accept_and_mask_and_a_mask_after_batch(client: AsyncClient) -> None:
    vocab = await client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
    async with await client.session(vocab, gbnf=AB_PLUS) as session:
        taken, mask = await session.accept_and_mask(B)
        assert not taken and np.array_equal(mask, engine_mask([])) and session.history == ()
        taken, mask = await session.accept_and_mask(A)
        assert taken and np.array_equal(mask, engine_mask([A])) and session.history == (A,)
    sessions = [await client.session(vocab, gbnf=AB_PLUS) for _ in range(3)]
    outcomes = await client.step([(s, t) for s, t in zip(sessions, [A, B, AB], strict=True)], mask_after=True)
    assert [o.accepted for o in outcomes] == [True, False, True]
    expected = [engine_mask([A]), engine_mask([]), engine_mask([AB])]
    for outcome, mask in zip(outcomes, expected, strict=True):
        assert outcome.mask is not None and np.array_equal(outcome.mask, mask)
    assert [s.history for s in sessions] == [(A,), (), (AB,)]


# What a refusal is to its caller: its class, its message (with the session's id, which differs from one
# client to another, taken out) and its attributes (a GrammarError's line, column, excerpt; a SchemaError's
# pointer).
Refusal = tuple[type[ConstraintdError], str, dict[str, Any]]


async def refusals(client: AsyncClient) -> dict[str, Refusal]:
    """Every kind of refusal `client` raises: unary calls, then Step results (over gRPC an Accept goes as a
    Step of one accept, and `step` sends ops and an accept batch)."""
    vocab = await client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
    session = await client.session(vocab, gbnf=AB_PLUS)
    closed = await client.session(vocab, gbnf=AB_PLUS)
    await closed.close()
    attempts: dict[str, Callable[[], Awaitable[Any]]] = {
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
            await attempt()
        error = raised.value
        caught[name] = (type(error), str(error).replace(closed.id, "<id>"), vars(error))
    return caught


@pytest.mark.asyncio
async def test_a_refusal_raises_the_same_error_on_every_transport(client: AsyncClient) -> None:
    async with AsyncClient("local", policy=POLICY) as local:
        in_process = await refusals(local)
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
    assert await refusals(client) == in_process


@pytest.mark.asyncio
async def test_a_vocabulary_over_one_message_is_registered_in_parts(client: AsyncClient) -> None:
    local = Vocab.from_gguf(reference.gemma_path())
    handle = await client.register_vocab(vocab=local)
    assert handle.id == local.content_hash and handle.size == 262_144


@pytest.mark.slow
@pytest.mark.asyncio
async def test_many_concurrent_sessions(client: AsyncClient) -> None:
    vocab = await client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)

    async def one(length: int) -> tuple[int, ...]:
        session = await client.session(vocab, gbnf=AB_PLUS)
        assert await session.accept(A)
        for _ in range(length):
            assert await session.accept(B)
        assert np.array_equal(await session.mask(), engine_mask([A] + [B] * length))
        assert await session.accept(EOS)
        await session.close()
        return session.history

    histories = await asyncio.gather(*(one(1 + n % 9) for n in range(150)))
    assert histories == [(A, *[B] * (1 + n % 9), EOS) for n in range(150)]


@pytest.mark.asyncio
async def test_step_batches_on_one_stream(client: AsyncClient) -> None:
    vocab = await client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
    sessions = [await client.session(vocab, gbnf=AB_PLUS) for _ in range(16)]
    for round_ in range(5):
        token = A if round_ == 0 else B
        outcomes = await client.step([(s, token) for s in sessions])
        assert all(o.accepted for o in outcomes)
    masks = await client.step([(s, None) for s in sessions])
    assert all(np.array_equal(o.mask, engine_mask([A, B, B, B, B])) for o in masks if o.mask is not None)
    rejected = await client.step([(sessions[0], A)])
    assert rejected[0].accepted is False and rejected[0].mask is not None
    assert [s.history for s in sessions] == [(A, B, B, B, B)] * 16


@pytest.mark.asyncio
async def test_accept_goes_over_the_step_stream_with_the_unary_answers() -> None:
    with socket_dir() as directory:
        async with (
            running_service(server_config(directory)) as service,
            AsyncClient(service.addresses[0], policy=POLICY) as client,
        ):
            vocab = await client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
            session = await client.session(vocab, gbnf=AB_PLUS)
            assert await session.accept(A) and not await session.accept(A)
            rejected = await session.accept_or_mask(A)
            assert rejected is not None and np.array_equal(rejected, engine_mask([A]))
            with pytest.raises(InputError, match="outside the vocabulary"):
                await session.accept(-5)
            metrics = service.metrics
            assert metrics.step_ops.value("accept") == 4 and metrics.rpcs.value("Accept", "OK") == 0


@pytest.mark.asyncio
async def test_concurrent_step_batches_each_get_their_own_reply(client: AsyncClient) -> None:
    """Four groups of sessions step at once (batches pipelined on one stream); each group's rejections and
    histories are its own."""
    vocab = await client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
    groups = [[await client.session(vocab, gbnf=AB_PLUS) for _ in range(3)] for _ in range(4)]

    async def run(group: list[AsyncSession], rounds: int) -> list[bool | None]:
        verdicts = []
        for round_ in range(rounds):
            token = A if round_ == 0 else B
            verdicts += [o.accepted for o in await client.step([(s, token) for s in group])]
        verdicts += [o.accepted for o in await client.step([(group[0], A)], mask_on_reject=False)]
        return verdicts

    results = await asyncio.gather(
        *(run(group, rounds) for group, rounds in zip(groups, (2, 5, 3, 4), strict=True))
    )
    for group, rounds, verdicts in zip(groups, (2, 5, 3, 4), results, strict=True):
        assert verdicts == [True] * (3 * rounds) + [False]
        assert [s.history for s in group] == [(A,) + (B,) * (rounds - 1)] * 3


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_server_restarted_under_in_flight_calls_changes_no_token() -> None:
    """Eight seeded generations at once over llama-spm (32,000 tokens), a JSON schema each; at step 10 of
    the first one the server stops at once (in-flight calls cancelled, every session and the vocabulary
    lost) and a new server starts on the same socket. Every generation ends with the tokens of an
    uninterrupted in-process run."""
    path = reference.require(reference.vocab_path("llama-spm"))
    eog = frozenset(Vocab.from_gguf(path).eog_ids)
    seeds = range(8)
    async with AsyncClient("local") as local:
        vocab = await local.register_vocab(gguf=path)
        expected = [
            await generate_async(await local.session(vocab, json_schema=SCHEMA), seed=seed, steps=25, eog=eog)
            for seed in seeds
        ]
    with socket_dir() as directory:
        config = server_config(directory, listen=(f"unix://{directory}/s.sock",), shutdown_grace=0.0)
        services = [Service(config)]
        await services[0].startup()

        async def restart(step: int) -> None:
            if step == 10:
                await services[-1].shutdown()
                services.append(Service(config))
                await services[-1].startup()

        try:
            async with AsyncClient(f"unix://{directory}/s.sock", policy=POLICY) as client:
                vocab = await client.register_vocab(gguf=path)
                sessions = [await client.session(vocab, json_schema=SCHEMA) for _ in seeds]
                runs = [
                    generate_async(
                        session, seed=seed, steps=25, eog=eog, before_step=restart if seed == 0 else None
                    )
                    for seed, session in zip(seeds, sessions, strict=True)
                ]
                tokens = await asyncio.gather(*runs)
                outcomes = await client.step([(s, None) for s in sessions])  # the Step stream reopens too
                assert len(outcomes) == len(sessions)
        finally:
            for service in services:
                await service.shutdown()
    assert len(services) == 2 and len(services[1].store) == 0
    assert tokens == expected


@pytest.mark.asyncio
async def test_an_expired_session_is_rebuilt() -> None:
    now = [0.0]
    with socket_dir() as directory:
        config = server_config(
            directory, limits=dataclasses.replace(server_config(directory).limits, default_ttl=5)
        )
        async with (
            running_service(config, clock=lambda: now[0]) as service,
            AsyncClient(service.addresses[1], policy=POLICY) as client,
        ):
            vocab = await client.register_vocab(pieces=TINY_PIECES, eog=TINY_EOG)
            session = await client.session(vocab, gbnf=AB_PLUS)
            assert await session.accept(A)
            now[0] = 60.0
            outcomes = await client.step([(session, B)])  # lost in a batch: redone alone after a rebuild
            assert outcomes[0].accepted and session.history == (A, B)
            assert len(service.store) == 1
