"""RegisterVocab's `gguf_path` attacked over a real server's Unix socket (service/registry.py): a device that
never ends, a FIFO that blocks, files outside the allowed directories, symbolic links and `..` out of them,
a file that is not GGUF. Each is refused at once with INVALID_ARGUMENT, one message for every refused path
(nothing says whether it exists), no byte of the file quoted, and the server keeps answering."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from constraintd.v1 import constraintd_pb2 as pb
from constraintd.v1 import constraintd_pb2_grpc as pb_grpc
from tests.server.running import TINY_EOG, TINY_PIECES, running_service, server_config, socket_dir

Stub = Any
REFUSED = "no such regular file in the directories this server reads vocabularies from"


@pytest_asyncio.fixture
async def served() -> AsyncIterator[tuple[Stub, Path]]:
    """A server that reads GGUF files from `models/` only, and that directory."""
    with socket_dir() as directory:
        models = directory / "models"
        models.mkdir()
        config = server_config(directory, listen=(f"unix://{directory}/s.sock",), gguf_dirs=(models,))
        async with (
            running_service(config) as service,
            grpc.aio.insecure_channel(service.addresses[0]) as channel,
        ):
            yield pb_grpc.ConstraintdStub(channel), models


async def refusal(stub: Stub, path: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.RegisterVocab(pb.RegisterVocabRequest(gguf_path=path), timeout=10)
    return raised.value


async def still_serving(stub: Stub) -> None:
    reply = await stub.RegisterVocab(
        pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=TINY_PIECES, eog=TINY_EOG))
    )
    assert reply.size == len(TINY_PIECES)


@pytest.mark.asyncio
async def test_paths_outside_the_directories_get_one_answer_whatever_they_are(
    served: tuple[Stub, Path],
) -> None:
    stub, models = served
    (models / "zero.gguf").symlink_to("/dev/zero")
    (models / "environ.gguf").symlink_to("/proc/self/environ")
    environ_head = Path("/proc/self/environ").read_bytes()[:4]
    paths = [
        "/dev/zero",
        "/etc/shadow",
        "/proc/self/environ",
        "/nonexistent/file.gguf",
        str(models / ".." / ".." / "etc" / "passwd"),
        str(models / "zero.gguf"),
        str(models / "environ.gguf"),
        str(models / "missing.gguf"),
        "a\0b",
    ]
    for path in paths:
        error = await refusal(stub, path)
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, path
        assert error.details() == f"cannot read GGUF file {path!r}: {REFUSED}", path
        assert repr(environ_head)[2:-1] not in (error.details() or "").replace(repr(path), "")
    await still_serving(stub)


@pytest.mark.asyncio
async def test_a_fifo_in_an_allowed_directory_blocks_nothing(served: tuple[Stub, Path]) -> None:
    stub, models = served
    os.mkfifo(models / "pipe.gguf")
    for _ in range(3):  # more than the compile threads: once, each would have blocked one for good
        error = await refusal(stub, str(models / "pipe.gguf"))
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == f"cannot read GGUF file {str(models / 'pipe.gguf')!r}: {REFUSED}"
    await still_serving(stub)


@pytest.mark.asyncio
async def test_a_file_that_is_not_gguf_is_refused_without_a_byte_of_it(served: tuple[Stub, Path]) -> None:
    stub, models = served
    for name, content in [("secret.gguf", b"SECRET=hunter2\n" * 4), ("short.gguf", b"PW=x")]:
        (models / name).write_bytes(content)
        error = await refusal(stub, str(models / name))
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == f"GGUF file {str(models / name)!r} is not a GGUF file"
    await still_serving(stub)


@pytest.mark.asyncio
async def test_a_server_without_directories_reads_no_file() -> None:
    with socket_dir() as directory:
        config = server_config(directory, listen=(f"unix://{directory}/s.sock",), gguf_dirs=())
        async with (
            running_service(config) as service,
            grpc.aio.insecure_channel(service.addresses[0]) as channel,
        ):
            stub = pb_grpc.ConstraintdStub(channel)
            error = await refusal(stub, "/dev/zero")
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "started without --gguf-dir" in (error.details() or "")
