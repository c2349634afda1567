"""Clients of constraintd: `Client` (blocking) and `AsyncClient` (asyncio), remote or in-process.

    from clients import Client

    client = Client("unix:///run/constraintd.sock")       # or Client("local"): the engine in this process
    vocab = client.register_vocab(gguf="/models/model.gguf")
    with client.session(vocab, json_schema={"type": "object"}) as session:
        mask = session.accept_or_mask(token)               # None: accepted; else the packed mask
        if mask is not None:
            apply_mask(logits, mask)                       # -inf where forbidden; sample again
        accepted, mask = session.accept_and_mask(token)    # mask-ahead: the mask of the state after it
        if not mask_allows(mask, next_token): ...

A session keeps the tokens it accepted, so when the server loses it (restart, expiry) the client
rebuilds it by replay and goes on; calls retry while the server is unavailable.
"""

from clients.async_client import AsyncClient, AsyncSession
from clients.base import ClientTls
from clients.chat import ChatRequest, ChatSettings
from clients.client import Client, Session
from clients.flows import Policy, StepOutcome, VocabHandle
from clients.masks import count_allowed, mask_allows
from clients.status import ServiceError
from constraintd.engine.masks.bitmask import apply_mask, unpack_mask

__all__ = [
    "AsyncClient",
    "AsyncSession",
    "ChatRequest",
    "ChatSettings",
    "Client",
    "ClientTls",
    "Policy",
    "ServiceError",
    "Session",
    "StepOutcome",
    "VocabHandle",
    "apply_mask",
    "count_allowed",
    "mask_allows",
    "unpack_mask",
]
