# What a constraintd server is told at startup: where to listen, how to secure it, and its limits
# (service/limits.py).
#
# Invariants:
# - Configuration is a value: frozen, built once (by `constraintd serve` or a test) and passed explicitly to
#   every part that needs it; nothing reads the environment or module globals after startup.
# - Every limit a caller can reach has a name here and a clear error when reached (LimitError for sizes and
#   counts, DeadlineError for time); `Limits()` holds defaults fit for a sidecar beside one model server.
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from constraintd.engine.masks.ahead import LOOKAHEAD_SECONDS
from constraintd.service.limits import Limits

__all__ = ["LogFormat", "ServerConfig", "TlsFiles"]


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for TLS; with `client_ca`, clients must present a certificate it signed (mTLS)."""

    cert: Path
    key: Path
    client_ca: Path | None = None


class LogFormat(enum.Enum):
    JSON = "json"
    TEXT = "text"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything a server needs to start.

    Attributes:
        listen: addresses to serve on: `unix:///path/to.sock`, `host:port` (port 0 picks a free one).
        tls: certificate files; None serves plaintext (fit for a Unix socket shared with one pod).
        bearer_token: when set, every call except health checks must carry `authorization: Bearer <token>`.
        socket_mode: the permission bits of every Unix socket the server listens on (0600: only its own
            user may connect; 0660 lets a group in, such as the containers of a pod sharing its fsGroup).
            The socket is created with no more than 0600 whatever the umask, then given this mode.
        metrics_listen: `host:port` for Prometheus text metrics over HTTP (`GET /metrics`); None: off.
        gguf_dirs: directories RegisterVocab may read GGUF files from (regular files under them, symbolic
            links and `..` resolved); empty: RegisterVocab reads no file, and vocabularies come as pieces.
        cache_dirs: directories of prepared vocabularies (`constraintd warm`): a GGUF file registered by
            path is loaded from the first that holds its vocabulary, else read and saved in the first that
            can be written (one that cannot, such as a cache baked into a read-only image, is only read).
        warm_seconds: seconds to spend warming each new vocabulary's JSON verdicts before its registration
            returns (engine/masks/warm.py); 0 leaves them to the first sessions.
        workers: threads that run compiles off the event loop.
        compile_processes: worker processes that run the heavy, vocabulary-free half of a compile (schema
            conversion, GBNF parse) for those threads, so it does not contend for the server's GIL, and a
            compile past its time limit can be stopped; started on first need. 0 runs it in the threads.
        compile_nice: how far below the server's priority the compile processes run (a nice increment;
            the lowest, 19, by default). Measured on two cores with the service benchmark's client on the
            same machine: a busy process at nice 10 triples Accept's p99, at 19 it leaves it within 10%;
            but a compile at 19 gets almost no CPU while the cores are saturated (see processes.py).
        mask_workers: threads that compute whole-vocabulary masks off the event loop.
        lookahead_seconds: CPU seconds a thread spends on each new grammar, after the first session on it
            is created and while nothing else is computed, learning the verdicts its first masks are
            composed from (server/ahead.py): the time a session's prompt is evaluated in; 0: none, each
            state's first mask pays for its own.
        shutdown_grace: seconds in-flight calls get to finish after a shutdown begins.
        reclaim_interval: seconds between sweeps of idle sessions.
        settle_interval: seconds between readings of the server's resident size, after which memory a
            burst freed is given back (memory.py); 0 never gives it back.
        use_uvloop: run on uvloop when it is installed.
        switch_interval: seconds a thread holding the GIL runs before a waiting one may take it (Python's
            `sys.setswitchinterval`, 0.005 by default); shorter lets the event loop answer sooner while
            worker threads compile, at a small cost in compile speed. None leaves the process's setting.
        log_format: structured JSON lines, or plain text for a terminal.
        limits: the bounds above.
    """

    listen: tuple[str, ...] = ("127.0.0.1:50051",)
    tls: TlsFiles | None = None
    bearer_token: str | None = None
    socket_mode: int = 0o600
    metrics_listen: str | None = None
    gguf_dirs: tuple[Path, ...] = ()
    cache_dirs: tuple[Path, ...] = ()
    warm_seconds: float = 0.0
    workers: int = 2
    compile_processes: int = 1
    compile_nice: int = 19
    mask_workers: int = 2
    lookahead_seconds: float = LOOKAHEAD_SECONDS
    shutdown_grace: float = 10.0
    reclaim_interval: float = 30.0
    settle_interval: float = 1.0
    use_uvloop: bool = True
    switch_interval: float | None = 0.0002
    log_format: LogFormat = LogFormat.JSON
    limits: Limits = field(default_factory=Limits)
