# The standard gRPC health service (grpc.health.v1.Health) for the whole server and for Constraintd.
#
# Invariants:
# - NOT_SERVING until startup has bound every address and started the server; SERVING while it serves;
#   NOT_SERVING for good from the first moment of shutdown (before the server stops taking calls), so a
#   load balancer or kubelet stops sending new work while in-flight work drains.
from __future__ import annotations

from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from constraintd.v1 import constraintd_pb2 as pb

__all__ = ["SERVICE_NAME", "Health"]

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["Constraintd"].full_name
_SERVICES = ("", SERVICE_NAME)


class Health:
    """The health servicer and the service's serving status."""

    def __init__(self) -> None:
        self.servicer = health.aio.HealthServicer()

    def add_to(self, server: object) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def starting(self) -> None:
        for service in _SERVICES:
            await self.servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def serving(self) -> None:
        for service in _SERVICES:
            await self.servicer.set(service, health_pb2.HealthCheckResponse.SERVING)

    async def not_serving(self) -> None:
        """NOT_SERVING for good: later calls to `serving` change nothing."""
        for service in _SERVICES:
            await self.servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.servicer.enter_graceful_shutdown()
