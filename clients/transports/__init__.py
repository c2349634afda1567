"""Transports: where a client's calls go (httpx's `_transports`, for constraintd's RPCs).

    base   the `Transport` and `AsyncTransport` protocols every transport follows
    grpc   `GrpcTransport`, `AsyncGrpcTransport`: a server over gRPC (Accept on an open Step stream)
    local  `LocalTransport`, `AsyncLocalTransport`: the service core in this process, no server

Every transport answers the same request with the same response message and raises the same
`ConstraintdError` for the same failure, so a client behaves alike over each. Nothing here imports
`constraintd.server`.
"""

from clients.transports.base import MIB, AsyncTransport, Transport
from clients.transports.grpc import AsyncGrpcTransport, GrpcTransport
from clients.transports.local import AsyncLocalTransport, LocalTransport

__all__ = [
    "MIB",
    "AsyncGrpcTransport",
    "AsyncLocalTransport",
    "AsyncTransport",
    "GrpcTransport",
    "LocalTransport",
    "Transport",
]
