# Who may call: TLS (mutual when a client CA is given) and an optional bearer token.
#
# Invariants:
# - With a token configured, every call must carry `authorization: Bearer <token>` metadata, compared in
#   constant time, or it fails with UNAUTHENTICATED before reaching the servicer, its request never
#   parsed. Health checks are the one exception: a probe (a kubelet) carries no secrets, and health
#   reveals nothing. A refusal is counted in the metrics like any other answer.
# - With a client CA, the TLS handshake itself refuses clients without a certificate it signed.
# - Certificate files are read once, at startup; a missing file fails startup, not the first call.
from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1.health import SERVICE_NAME as HEALTH_SERVICE

from constraintd.server.config import TlsFiles
from constraintd.server.metrics import Metrics

__all__ = ["BearerTokenInterceptor", "server_credentials"]

_OPEN_PREFIXES = (f"/{HEALTH_SERVICE}/",)


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """Server credentials from PEM files; requires client certificates when `tls.client_ca` is set.

    Raises:
        OSError: a file cannot be read.
    """
    pair = (tls.key.read_bytes(), tls.cert.read_bytes())
    client_ca = tls.client_ca.read_bytes() if tls.client_ca is not None else None
    return grpc.ssl_server_credentials(
        [pair], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def _refuser(
    method: str, metrics: Metrics | None
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]:
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        if metrics is not None:
            metrics.rpcs.inc(method, grpc.StatusCode.UNAUTHENTICATED.name)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    return refuse


# the handler kind -> how to build a handler of that kind that refuses
_REFUSERS: dict[str, Callable[..., grpc.RpcMethodHandler]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped
    """Refuses calls that do not carry the configured bearer token."""

    def __init__(self, token: str, *, metrics: Metrics | None = None) -> None:
        if not token:
            raise ValueError("an empty bearer token would let everyone in")
        self._expected = f"Bearer {token}".encode()
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(_OPEN_PREFIXES) or self._carries_token(details):
            return handler
        for kind, build in _REFUSERS.items():
            if getattr(handler, kind) is not None:
                # no deserializer: the request's bytes are never parsed for a caller that may not call
                return build(
                    _refuser(details.method.rpartition("/")[2], self._metrics),
                    request_deserializer=None,
                    response_serializer=handler.response_serializer,
                )
        return handler

    def _carries_token(self, details: grpc.HandlerCallDetails) -> bool:
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else bytes(value)
                return hmac.compare_digest(given, self._expected)
        return False
