# The service process's life as named steps: startup, serve, shutdown.
#
# Invariants:
# - All state lives in one `Service` object passed around explicitly (no module globals): registry,
#   session store, worker pools (threads, and the compile processes), metrics, the grpc.aio server, health.
# - startup: bind every address (failing startup if one cannot be bound, or if a live server answers on a
#   Unix socket's path: a stale socket file is removed, a live one never taken over; a Unix socket is
#   created 0600 whatever the umask, then given `socket_mode`), start the server, start the
#   metrics endpoint and the idle-session sweep, then report SERVING.
# - shutdown, in this order: health NOT_SERVING; stop opening sessions; `server.stop(grace)` (in-flight
#   calls get `grace` seconds, new calls are refused); stop the sweep, the workers (the compile processes
#   too) and the metrics endpoint; release every session.
# - The first SIGTERM or SIGINT begins the shutdown; a second one exits the process at once.
# - The event loop comes from a loop factory: uvloop when installed and wanted, asyncio's otherwise.
from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import logging
import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable

import grpc
from grpc_health.v1.health import SERVICE_NAME as HEALTH_SERVICE_NAME
from grpc_reflection.v1alpha import reflection

from constraintd.engine.masks.ahead import AheadRun
from constraintd.errors import UnavailableError
from constraintd.server.ahead import AheadWorker
from constraintd.server.config import ServerConfig
from constraintd.server.health import SERVICE_NAME, Health
from constraintd.server.memory import CollectorPauses, MemorySettler, fix_mmap_threshold
from constraintd.server.metrics import Metrics, MetricsServer
from constraintd.server.processes import ProcessPool
from constraintd.server.security import BearerTokenInterceptor, server_credentials
from constraintd.server.servicer import ConstraintdServicer, add_to_server
from constraintd.server.workers import WorkerPool
from constraintd.service.constraints import prepare
from constraintd.service.log_events import fields
from constraintd.service.operations import Operations
from constraintd.service.registry import Registry
from constraintd.service.sessions import SessionStore
from constraintd.service.vocab_store import VocabStore

__all__ = ["EXIT_FORCED", "Service", "ServiceState", "loop_factory", "run"]

log = logging.getLogger("constraintd.server")

EXIT_FORCED = 3


class ServiceState(enum.Enum):
    CREATED = "created"
    STARTING = "starting"
    SERVING = "serving"
    STOPPING = "stopping"
    STOPPED = "stopped"


def _force_exit() -> None:
    log.warning("second signal: exiting at once")
    os._exit(EXIT_FORCED)


class Service:
    """One constraintd server: its state and its three steps."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        force_exit: Callable[[], None] = _force_exit,
    ) -> None:
        self.config = config
        self.state = ServiceState.CREATED
        limits = config.limits
        vocab_store = VocabStore(config.cache_dirs) if config.cache_dirs else None
        # processes start on a first compile, so a service that compiles nothing starts none
        self.compile_processes = (
            ProcessPool(
                config.compile_processes,
                time_limit=limits.compile_timeout,
                name="constraintd-compile",
                nice=config.compile_nice,
                preload=[prepare.__module__],
            )
            if config.compile_processes > 0
            else None
        )
        self.registry = Registry(
            limits,
            gguf_dirs=config.gguf_dirs,
            vocab_store=vocab_store,
            warm_seconds=config.warm_seconds,
            processes=self.compile_processes,
        )
        self.store = SessionStore(limits, clock=clock)
        self.operations = Operations(self.registry, self.store, limits)
        self.metrics = Metrics(
            sessions_open=lambda: len(self.store),
            vocabs=lambda: self.registry.vocab_count,
            grammars=lambda: self.registry.grammar_count,
            cache_bytes=lambda: self.registry.cache_bytes,
        )
        self._collector_pauses = CollectorPauses(self.metrics.collector_seconds.observe)
        self.health = Health()
        self.addresses: list[str] = []
        self.metrics_port: int | None = None
        self._force_exit = force_exit
        self._stop_requested = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        self._workers: list[WorkerPool] = []
        self._ahead: AheadWorker | None = None
        self._metrics_server: MetricsServer | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._settler: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        """Binds, starts serving, reports SERVING.

        Raises:
            UnavailableError: an address cannot be bound.
            OSError: a TLS file cannot be read.
        """
        config = self.config
        self.state = ServiceState.STARTING
        await self.health.starting()
        compile_workers = WorkerPool(
            config.workers, time_limit=config.limits.compile_timeout, name="constraintd-compile"
        )
        mask_workers = WorkerPool(
            config.mask_workers, time_limit=config.limits.mask_timeout, name="constraintd-mask"
        )
        self._workers = [compile_workers, mask_workers]
        if config.lookahead_seconds > 0:
            metrics = self.metrics

            def counted(run: AheadRun) -> None:
                metrics.lookahead_seconds.inc(by=run.seconds)
                metrics.lookahead_tops.inc(by=run.tops)

            self._ahead = AheadWorker(config.lookahead_seconds, on_run=counted)
        interceptors = (
            [BearerTokenInterceptor(config.bearer_token, metrics=self.metrics)] if config.bearer_token else []
        )
        limits = config.limits
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", limits.max_request_bytes),
                ("grpc.max_send_message_length", limits.max_reply_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        servicer = ConstraintdServicer(
            self.operations,
            compile_workers=compile_workers,
            mask_workers=mask_workers,
            metrics=self.metrics,
            ahead=self._ahead,
        )
        add_to_server(servicer, server)
        self.health.add_to(server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        credentials = server_credentials(config.tls) if config.tls is not None else None
        self.addresses = [self._bind(server, address, credentials) for address in config.listen]
        self._server = server
        await server.start()
        if config.metrics_listen is not None:
            host, _, port = config.metrics_listen.rpartition(":")
            self._metrics_server = MetricsServer(self.metrics)
            self.metrics_port = await self._metrics_server.start(host.strip("[]") or "127.0.0.1", int(port))
        self._sweeper = asyncio.create_task(self._sweep(), name="constraintd-sweep")
        self._collector_pauses.start()
        if config.settle_interval > 0:
            settler = MemorySettler(interval=config.settle_interval)
            self._settler = asyncio.create_task(settler.run(), name="constraintd-settle")
        await self.health.serving()
        self.state = ServiceState.SERVING
        log.info(
            "serving",
            extra=fields(
                addresses=self.addresses,
                metrics_port=self.metrics_port,
                tls=config.tls is not None,
                token=config.bearer_token is not None,
            ),
        )

    async def serve(self) -> None:
        """Waits for a shutdown request (`request_shutdown`, a signal), then shuts down."""
        await self._stop_requested.wait()
        await self.shutdown()

    def request_shutdown(self) -> None:
        """Begins the shutdown; called a second time, exits the process at once."""
        if self._stop_requested.is_set():
            self._force_exit()
            return
        log.info("shutdown requested")
        self._stop_requested.set()

    async def shutdown(self) -> None:
        """NOT_SERVING, stop opening sessions, drain calls for the grace period, release everything."""
        if self.state in (ServiceState.STOPPING, ServiceState.STOPPED):
            return
        self.state = ServiceState.STOPPING
        await self.health.not_serving()
        self.store.stop_opening()
        if self._server is not None:
            await self._server.stop(self.config.shutdown_grace)
        for task in (self._sweeper, self._settler):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._collector_pauses.stop()
        for pool in self._workers:
            pool.shutdown()
        if self._ahead is not None:
            self._ahead.shutdown()
        if self.compile_processes is not None:
            self.compile_processes.close()
        if self._metrics_server is not None:
            await self._metrics_server.close()
        released = self.store.release_all()
        self.state = ServiceState.STOPPED
        log.info("stopped", extra=fields(sessions_released=released))

    def _bind(self, server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> str:
        path = _socket_path(address)
        if path is not None:
            _claim_socket_path(address, path)
        # grpc creates a Unix socket when the port is added, with the mode the umask leaves: the umask
        # is narrowed for that moment, so the socket is never more open than 0600 before its chmod.
        # (The umask is the process's; nothing else creates files while the server starts.)
        umask = os.umask(0o177) if path is not None else None
        try:
            if credentials is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, credentials)
        except RuntimeError as exc:
            raise UnavailableError(f"cannot listen on {address}: {exc}") from None
        finally:
            if umask is not None:
                os.umask(umask)
        if path is not None:
            os.chmod(path, self.config.socket_mode)
            return address
        if address.startswith("unix"):  # an abstract socket: no file
            return address
        host = address.rpartition(":")[0]
        return f"{host}:{port}"

    def reclaim_idle(self) -> int:
        """Removes the sessions past their idle deadline (the periodic sweep); returns how many."""
        reclaimed = self.store.reclaim()
        if reclaimed:
            self.metrics.sessions_reclaimed.inc(by=reclaimed)
            log.info("idle sessions reclaimed", extra=fields(count=reclaimed, open=len(self.store)))
        return reclaimed

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.config.reclaim_interval)
            self.reclaim_idle()


def _socket_path(address: str) -> str | None:
    """The file of a `unix:` address (`unix:///abs/path`, `unix:relative`); None for any other."""
    if address.startswith("unix://"):
        return address[len("unix://") :]
    if address.startswith("unix:"):
        return address[len("unix:") :]
    return None


def _claim_socket_path(address: str, path: str) -> None:
    """Makes `path` free for a new socket: a socket file nothing listens on (a killed server's) is
    removed; a live server's, or anything that is not a socket, is refused (grpc would silently unlink
    it and take the path over).

    Raises:
        UnavailableError: a server answers on `path`, or it is not a socket.
    """
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UnavailableError(f"cannot listen on {address}: {exc.strerror}") from None
    if not stat.S_ISSOCK(found.st_mode):
        raise UnavailableError(f"cannot listen on {address}: {path} exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)  # a listener with a full backlog makes connect wait: it is alive
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            log.info("stale socket removed", extra=fields(path=path))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:  # a timeout, or a socket we may not connect to: someone else's
            raise UnavailableError(f"cannot listen on {address}: {path} is in use ({exc})") from None
    raise UnavailableError(f"cannot listen on {address}: another server is listening there")


def loop_factory(use_uvloop: bool) -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's event loop when it is installed and wanted, asyncio's default otherwise."""
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            log.info("uvloop is not installed; using asyncio's event loop")
        else:
            factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
            return factory
    return asyncio.new_event_loop


async def _main(service: Service) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.request_shutdown)
    try:
        await service.startup()
        await service.serve()
    finally:
        await service.shutdown()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def run(config: ServerConfig) -> int:
    """Runs a service until a signal stops it; the process's exit code (0 after a clean shutdown).

    This is a process's entry point: it sets the process-wide GIL switch interval when configured, and
    moves what the imports made out of the garbage collector's sight (`gc.freeze`): those objects live as
    long as the process, and without them a full collection, which stops every thread, takes about a
    millisecond instead of 15 (measured on two cores with a 151k vocabulary and two large schemas
    compiled); the service benchmark's compiles set off several.
    """
    if config.switch_interval is not None:
        sys.setswitchinterval(config.switch_interval)
    if config.settle_interval > 0:
        fix_mmap_threshold()
    gc.collect()  # what is garbage now is not frozen with the rest
    gc.freeze()
    with asyncio.Runner(loop_factory=loop_factory(config.use_uvloop)) as runner:
        runner.run(_main(Service(config)))
    return 0
