"""A server's Unix socket (server/lifecycle.py): created 0600 whatever the umask (or the mode asked for),
never taken over from a live server on the same path, and left by a killed one only as a stale file that
the next server removes. Each against a real server on a temporary socket."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from constraintd.errors import UnavailableError
from constraintd.server.config import ServerConfig
from constraintd.server.lifecycle import Service
from tests.server.running import running_service, server_config, socket_dir


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most open umask (000), as a careless entrypoint would leave it."""
    before = os.umask(0)
    try:
        yield
    finally:
        os.umask(before)


def unix_config(directory: Path, **changes: object) -> tuple[Path, ServerConfig]:
    path = directory / "s.sock"
    return path, server_config(directory, listen=(f"unix://{path}",), metrics_listen=None, **changes)


async def serving(target: str) -> bool:
    async with grpc.aio.insecure_channel(target) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("changes", "mode"), [({}, 0o600), ({"socket_mode": 0o660}, 0o660)], ids=["default", "group"]
)
async def test_the_socket_has_its_mode_whatever_the_umask(
    open_umask: None, changes: dict[str, int], mode: int
) -> None:
    with socket_dir() as directory:
        path, config = unix_config(directory, **changes)
        async with running_service(config):
            assert stat.S_IMODE(path.stat().st_mode) == mode


@pytest.mark.asyncio
async def test_a_second_server_on_a_live_socket_refuses_to_start() -> None:
    with socket_dir() as directory:
        _, config = unix_config(directory)
        async with running_service(config) as first:
            second = Service(config)
            with pytest.raises(UnavailableError, match="another server is listening there"):
                await second.startup()
            await second.shutdown()
            assert await serving(first.addresses[0])  # the first keeps its socket and its callers


@pytest.mark.asyncio
async def test_a_stale_socket_is_replaced_and_a_file_that_is_not_one_is_left_alone() -> None:
    with socket_dir() as directory:
        path, config = unix_config(directory)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
            dead.bind(str(path))  # a killed server's socket: the file stays, nothing listens
        async with running_service(config) as service:
            assert await serving(service.addresses[0])
        path.write_text("not a socket")
        refused = Service(config)
        with pytest.raises(UnavailableError, match="exists and is not a socket"):
            await refused.startup()
        await refused.shutdown()
        assert path.read_text() == "not a socket"
