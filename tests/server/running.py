"""Real constraintd servers for tests and benchmarks: in this event loop, in a thread, or in a subprocess.

Readiness is never waited for with sleeps: an in-process server is ready when `Service.startup` returns;
a subprocess is ready when a health check that waits for the channel (wait_for_ready) answers SERVING.
Unix socket paths are kept short (a socket path has a ~100 byte limit), under a fresh directory in /tmp.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients import Client, Policy
from constraintd.server.config import LogFormat, ServerConfig
from constraintd.server.lifecycle import Service
from constraintd.server.memory import resident_bytes
from tests import reference

ROOT = Path(__file__).resolve().parents[2]

# A small vocabulary with the shapes grammars care about: single characters, multi-character pieces,
# an end-of-generation token, an empty piece and a NUL-led piece (never allowed), a multi-byte character
# split over two tokens.
TINY_PIECES: tuple[bytes, ...] = (
    b"{",
    b"}",
    b'"',
    b"a",
    b"b",
    b":",
    b",",
    b" ",
    b"1",
    b"2",
    b"ab",
    b'{"',
    b'":',
    b"</s>",
    b"",
    b"\x00x",
    b"true",
    b"null",
    b"\xc3",
    b"\xa9",
)
TINY_EOG = (13,)
EOS = 13
AB_PLUS = 'root ::= "a" "b"+'
# The directory test servers read GGUF files from: llama.cpp's vocabulary-only files.
GGUF_DIR = reference.vocab_path("llama-spm").parent


@contextlib.contextmanager
def socket_dir() -> Iterator[Path]:
    """A short-lived directory with a short path, for Unix sockets."""
    path = Path(tempfile.mkdtemp(prefix="cd-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def server_config(directory: Path, **changes: object) -> ServerConfig:
    """A server on a Unix socket in `directory` and on a free loopback TCP port, metrics on another."""
    base = ServerConfig(
        listen=(f"unix://{directory}/constraintd.sock", "127.0.0.1:0"),
        metrics_listen="127.0.0.1:0",
        use_uvloop=False,
        log_format=LogFormat.TEXT,
        shutdown_grace=2.0,
        gguf_dirs=(GGUF_DIR,),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running_service(
    config: ServerConfig, *, clock: Callable[[], float] | None = None
) -> AsyncIterator[Service]:
    """A started service in this event loop, shut down on exit."""
    service = Service(config, clock=clock) if clock is not None else Service(config)
    await service.startup()
    try:
        yield service
    finally:
        await service.shutdown()


class ServerThread:
    """A service on its own event loop in a thread, for blocking clients in the test's thread."""

    def __init__(self, config: ServerConfig, *, clock: Callable[[], float] | None = None) -> None:
        self.config = config
        self.clock = clock
        self.service: Service | None = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="test-server", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self.service = Service(self.config, clock=self.clock) if self.clock else Service(self.config)
            self._loop.run_until_complete(self.service.startup())
        except BaseException as exc:  # reported to the test thread by start()
            self._failure = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    def start(self) -> Service:
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure
        assert self.service is not None
        return self.service

    def stop(self) -> None:
        if self.service is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self.service.shutdown(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


@contextlib.contextmanager
def client_of(kind: str, policy: Policy) -> Iterator[Client]:
    """A client in this process ("local"), or of a server of its own in a thread, over its Unix socket
    ("unix") or loopback TCP ("tcp"); the server stops on exit."""
    if kind == "local":
        with Client("local", policy=policy) as local:
            yield local
        return
    with socket_dir() as directory:
        server = ServerThread(server_config(directory))
        service = server.start()
        try:
            with Client(service.addresses[0 if kind == "unix" else 1], policy=policy) as remote:
                yield remote
        finally:
            server.stop()


def wait_serving(target: str, *, timeout: float = 120.0, server: ServerProcess | None = None) -> None:
    """Blocks until the server at `target` answers a health check with SERVING.

    With `server`, a process that exits first fails at once; either failure quotes the end of its log.
    Reconnection backs off at most half a second, so a server slow to bind on a loaded machine is seen as
    soon as it serves, not at gRPC's next backoff (which grows past 20 s).
    """
    deadline = time.monotonic() + timeout
    options = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 500)]
    with grpc.insecure_channel(target, options=options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="")
        while (left := deadline - time.monotonic()) > 0:
            if server is not None and server.process is not None and server.process.poll() is not None:
                raise RuntimeError(
                    f"the server at {target} exited with {server.process.returncode} before serving:\n"
                    + server.log_tail()
                )
            try:
                reply = stub.Check(request, timeout=min(left, 1.0), wait_for_ready=True)
            except grpc.RpcError as error:
                if error.code() is not grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
                    raise
                continue
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(0.05)
    tail = "" if server is None else ":\n" + server.log_tail()
    raise RuntimeError(f"the server at {target} did not report SERVING within {timeout:.0f} s{tail}")


class ServerProcess:
    """`constraintd serve` in a subprocess, on one Unix socket; its log goes to a file beside the socket."""

    def __init__(self, socket: Path, *extra: str) -> None:
        self.socket = socket
        self.target = f"unix://{socket}"
        self.args = [sys.executable, "-m", "constraintd", "serve", "--listen", self.target]
        self.args += ["--log-format", "text", "--no-uvloop", "--gguf-dir", str(GGUF_DIR), *extra]
        self.log = socket.with_suffix(".log")
        self.process: subprocess.Popen[bytes] | None = None

    def launch(self) -> ServerProcess:
        """Starts the process and returns at once (a client's calls wait for it to be ready)."""
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log
            )
        return self

    def start(self) -> ServerProcess:
        """Starts the process and returns once it serves."""
        self.launch()
        wait_serving(self.target, server=self)
        return self

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of what the process has logged."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:]) or "(nothing logged)"

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def wait(self, timeout: float = 60.0) -> tuple[int, str]:
        """Waits for the process to end; its exit code and everything it logged."""
        assert self.process is not None
        code = self.process.wait(timeout=timeout)
        return code, self.log.read_text(errors="replace")


# A capped server's address space: Python, numpy and grpc's threads reserve about 1 GiB before any work.
ADDRESS_SPACE = 3 << 30


class CappedServer(ServerProcess):
    """A ServerProcess whose address space is capped at `ADDRESS_SPACE` bytes."""

    def launch(self) -> CappedServer:
        # capped from here once it runs, not between fork and exec (`preexec_fn`): with this process's gRPC
        # threads about, a forked copy that runs Python before exec may abort or hang; the cap matters only
        # once the server serves, long after its start
        super().launch()
        assert self.process is not None
        resource.prlimit(self.process.pid, resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
        return self

    def rss(self) -> int:
        """Resident bytes of the server process."""
        assert self.process is not None
        return resident_bytes(self.process.pid)

    def cpu_seconds(self) -> float:
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
