# A private constraintd for one run of the worker: `constraintd serve` on a Unix socket of its own.
#
# Contract:
# - `PrivateConstraintd()` starts the server in a subprocess (this Python, `-m constraintd serve`),
#   listening only on a socket in a fresh directory under /tmp (a socket path must stay short), and
#   returns once the server answers a health check with SERVING. Nothing waits by sleeping: each
#   check blocks until the channel is ready or a short deadline passes, and between checks we look
#   whether the process died (then its log is in the error).
# - The server reads GGUF files from anywhere under `gguf_dirs` (the whole file system by default): its
#   socket is in a directory only this user can enter, so its one caller is this process, which could
#   read those files itself. A device, FIFO or non-GGUF file is refused all the same (service/registry.py).
# - The server dies with this process: on Linux the kernel sends it SIGTERM when its parent goes, however
#   the parent goes (a crash of the model library, SIGKILL), and it shuts down as on any SIGTERM (its
#   compile processes with it). The server asks for that itself (`--parent-pid`), after exec: nothing
#   runs between fork and exec here, since with gRPC's threads in this process that is not safe.
#   `PR_SET_PDEATHSIG` follows the thread that started the child, so enter
#   the context from a thread that outlives it (both commands use the main thread). Only the directory,
#   a few bytes under /tmp, is left behind then. Elsewhere the server outlives a parent killed this way.
# - Leaving the context stops the server (SIGTERM, then SIGKILL after `grace` seconds) and removes
#   the directory with the socket and the log.

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["PrivateConstraintd", "SidecarError"]

_READY_CHECK_SECONDS = 0.5


class SidecarError(Exception):
    """The private constraintd did not start (its log is in the message)."""


class PrivateConstraintd:
    """`constraintd serve` on a private Unix socket, for the length of a `with` block.

    Attributes:
        target: the gRPC target to connect to (`unix:///tmp/.../constraintd.sock`).
    """

    def __init__(
        self,
        *,
        startup_timeout: float = 60.0,
        grace: float = 5.0,
        gguf_dirs: Sequence[Path] = (Path("/"),),
        serve_args: Sequence[str] = (),
    ) -> None:
        self.startup_timeout = startup_timeout
        self.grace = grace
        self.gguf_dirs = tuple(gguf_dirs)
        self.serve_args = tuple(serve_args)  # more `constraintd serve` arguments
        self.directory = Path(tempfile.mkdtemp(prefix="sw-", dir="/tmp"))
        self.target = f"unix://{self.directory}/constraintd.sock"
        self.log_path = self.directory / "constraintd.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrivateConstraintd:
        command = [
            sys.executable, "-m", "constraintd", "serve", "--listen", self.target,
            "--log-format", "text", "--log-level", "WARNING",
        ]  # fmt: skip
        for directory in self.gguf_dirs:
            command += ["--gguf-dir", str(directory)]
        if sys.platform.startswith("linux"):
            command += ["--parent-pid", str(os.getpid())]
        command += self.serve_args
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        try:
            self._wait_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def _wait_serving(self) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        with grpc.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.process.poll() is not None:
                    raise SidecarError(
                        f"constraintd exited with status {self.process.returncode} before serving:\n"
                        f"{self._log_tail()}"
                    )
                if time.monotonic() > deadline:
                    raise SidecarError(f"constraintd was not serving after {self.startup_timeout:g}s")
                try:
                    reply = stub.Check(
                        health_pb2.HealthCheckRequest(service=""),
                        timeout=_READY_CHECK_SECONDS,
                        wait_for_ready=True,
                    )
                except grpc.RpcError:
                    continue
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return

    def stop(self) -> None:
        """Stop the server and remove its directory (idempotent)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        shutil.rmtree(self.directory, ignore_errors=True)
