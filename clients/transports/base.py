# What every transport is: one request message in, its reply out, a failure raised as the
# `ConstraintdError` its status maps to, so nothing transport-specific escapes one.
#
# A transport is told the RPC's method name (`"Accept"`, `"Step"`, ...) and its request message of
# constraintd.v1, and answers with that RPC's response message. `Client` drives a `Transport`,
# `AsyncClient` an `AsyncTransport`; both flavours exist for gRPC (grpc.py) and in-process (local.py).
from __future__ import annotations

from typing import Protocol

__all__ = ["MIB", "AsyncTransport", "Transport"]

MIB = 1 << 20


class Transport(Protocol):
    """Where a `Client`'s calls go: one request message in, its reply out, errors as ConstraintdError."""

    def call(self, method: str, request: object, *, timeout: float | None) -> object: ...

    def close(self) -> None: ...


class AsyncTransport(Protocol):
    """Where an `AsyncClient`'s calls go: one request in, its reply out, errors as ConstraintdError."""

    async def call(self, method: str, request: object, *, timeout: float | None) -> object: ...

    async def close(self) -> None: ...
