"""Vocabulary slots over a real server (service/registry.py, sessions.py): more vocabularies than
`max_vocabs` registered one after another all get a slot, the least recently used one no open session uses
giving up its own; the count never passes the bound, and a vocabulary an open session uses is never
released (its session keeps answering)."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from constraintd.service.limits import Limits
from constraintd.v1 import constraintd_pb2 as pb
from constraintd.v1 import constraintd_pb2_grpc as pb_grpc
from tests.server.running import AB_PLUS, TINY_PIECES, running_service, server_config, socket_dir

SLOTS = 2


def registration(eog: int) -> pb.RegisterVocabRequest:
    return pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=TINY_PIECES, eog=[eog]))


@pytest.mark.asyncio
async def test_slots_are_taken_back_from_unused_vocabularies_and_never_from_used_ones() -> None:
    limits = dataclasses.replace(Limits(), max_vocabs=SLOTS)
    with socket_dir() as directory:
        config = server_config(directory, listen=(f"unix://{directory}/s.sock",), limits=limits)
        async with (
            running_service(config) as service,
            grpc.aio.insecure_channel(service.addresses[0]) as channel,
        ):
            stub = pb_grpc.ConstraintdStub(channel)
            ids = [(await stub.RegisterVocab(registration(eog))).vocab_id for eog in range(8)]
            assert len(set(ids)) == 8  # once, the third was refused until a restart
            assert service.registry.vocab_count == SLOTS

            sessions = []
            for vocab_id in ids[-SLOTS:]:  # every slot used by a session
                reply = await stub.CreateSession(
                    pb.CreateSessionRequest(vocab_id=vocab_id, gbnf=pb.Gbnf(text=AB_PLUS))
                )
                sessions.append(reply.session_id)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.RegisterVocab(registration(9))
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "each used by open sessions" in (refused.value.details() or "")

            await stub.Close(pb.CloseRequest(session_id=sessions[0]))
            fresh = (await stub.RegisterVocab(registration(9))).vocab_id  # takes the closed one's slot
            assert service.registry.vocab_count == SLOTS
            with pytest.raises(grpc.aio.AioRpcError) as gone:
                await stub.CreateSession(
                    pb.CreateSessionRequest(vocab_id=ids[-2], gbnf=pb.Gbnf(text=AB_PLUS))
                )
            assert gone.value.code() is grpc.StatusCode.NOT_FOUND
            kept = await stub.Accept(pb.AcceptRequest(session_id=sessions[1], token=3))
            assert kept.accepted  # the session on the vocabulary kept answers as before
            await stub.CreateSession(pb.CreateSessionRequest(vocab_id=fresh, gbnf=pb.Gbnf(text=AB_PLUS)))
