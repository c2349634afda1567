"""The client's public API is exactly what `clients.__all__` lists, and every name in it resolves."""

from __future__ import annotations

import clients

PUBLIC = [
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


def test_public_names() -> None:
    assert sorted(clients.__all__) == PUBLIC


def test_public_names_resolve() -> None:
    missing = [name for name in clients.__all__ if not hasattr(clients, name)]
    assert not missing
