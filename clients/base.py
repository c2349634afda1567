# What the sync and the async client share: settings, and the requests their arguments become.
#
# Invariants:
# - `Client` and `AsyncClient` differ only in how they perform I/O (they drive the same flows, from
#   clients/flows.py, with blocking calls or with awaits); everything decided from arguments is here, once.
# - A session asks for exactly one constraint; a vocabulary comes from exactly one source. Arguments that
#   break this raise ValueError before anything is sent.
# - The target "local" means the in-process transport (the engine in this process, no server); anything
#   else is a gRPC target (`unix:///path/to.sock`, `host:port`).
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clients.chat import ChatRequest
from clients.flows import Policy, VocabHandle
from constraintd.engine.vocab.vocab import Vocab
from constraintd.v1 import constraintd_pb2 as pb

__all__ = ["LOCAL", "BaseClient", "ClientTls"]

LOCAL = "local"
JsonText = str | Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ClientTls:
    """TLS settings of a client: the CA that signed the server, and for mTLS the client's own pair.

    Attributes:
        ca: PEM of the CA to trust (None: the system's roots).
        cert: PEM certificate chain of the client (mTLS).
        key: PEM private key of the client (mTLS).
        server_name: the name to check the server's certificate against, when it is not the target's host.
    """

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None


def _json_text(value: JsonText) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class BaseClient:
    """Settings and request building shared by `Client` and `AsyncClient`."""

    def __init__(self, target: str, *, policy: Policy) -> None:
        self.target = target
        self.policy = policy

    @staticmethod
    def _registration(
        *,
        gguf: str | os.PathLike[str] | None,
        vocab: Vocab | None,
        pieces: Sequence[bytes] | None,
        eog: Sequence[int],
        token_texts: Sequence[str] | None,
    ) -> pb.RegisterVocabRequest:
        given = [
            name
            for name, value in (("gguf", gguf), ("vocab", vocab), ("pieces", pieces))
            if value is not None
        ]
        if len(given) != 1:
            raise ValueError(
                f"register_vocab takes exactly one of gguf=, vocab=, pieces= (got {given or 'none'})"
            )
        if gguf is not None:
            return pb.RegisterVocabRequest(gguf_path=os.fspath(gguf))
        request = pb.RegisterVocabRequest()
        listed = request.pieces
        if vocab is not None:
            listed.pieces.extend(vocab.pieces)
            listed.eog.extend(sorted(vocab.eog_ids))
            if vocab.token_texts is not None:
                listed.token_texts.extend(vocab.token_texts)
            if vocab.token_attrs is not None:
                listed.token_attrs.extend(vocab.token_attrs)
            rules = vocab.tokenizer
            if rules is not None:
                listed.tokenizer.CopyFrom(
                    pb.Tokenizer(
                        model=rules.model,
                        add_space_prefix=rules.add_space_prefix,
                        escape_whitespaces=rules.escape_whitespaces,
                    )
                )
            return request
        assert pieces is not None
        listed.pieces.extend(pieces)
        listed.eog.extend(eog)
        if token_texts is not None:
            listed.token_texts.extend(token_texts)
        return request

    @staticmethod
    def _session_request(
        vocab: VocabHandle,
        *,
        gbnf: str | None,
        root: str,
        json_schema: JsonText | None,
        json_object: bool,
        openai_request: JsonText | None,
        ollama_request: JsonText | None,
        trigger_patterns: Sequence[str],
        trigger_tokens: Sequence[int],
        prefill: str | bytes,
        ttl: float | None,
        strict: bool = False,
        dialect: str = "llama.cpp",
        chat: ChatRequest | None = None,
    ) -> pb.CreateSessionRequest:
        request = pb.CreateSessionRequest(
            vocab_id=vocab.id, strict=strict, schema_dialect="" if dialect == "llama.cpp" else dialect
        )
        given = []
        if gbnf is not None:
            request.gbnf.CopyFrom(pb.Gbnf(text=gbnf, root=root))
            given.append("gbnf")
        if json_schema is not None:
            request.json_schema = _json_text(json_schema)
            given.append("json_schema")
        if json_object:
            request.json_object.SetInParent()
            given.append("json_object")
        if openai_request is not None:
            request.openai_request = _json_text(openai_request)
            given.append("openai_request")
        if ollama_request is not None:
            request.ollama_request = _json_text(ollama_request)
            given.append("ollama_request")
        if chat is not None:
            request.chat.CopyFrom(chat.to_proto())
            given.append("chat")
        if len(given) != 1:
            raise ValueError(
                "a session takes exactly one of gbnf=, json_schema=, json_object=True, "
                f"openai_request=, ollama_request=, chat= (got {given or 'none'})"
            )
        options = request.options
        options.trigger_patterns.extend(trigger_patterns)
        options.trigger_tokens.extend(trigger_tokens)
        options.prefill = prefill.encode() if isinstance(prefill, str) else prefill
        if ttl is not None:
            options.ttl_seconds = max(1, round(ttl))
        return request
