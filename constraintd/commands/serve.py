"""Serve the constraintd gRPC service (sessions, masks, health, reflection, metrics).

Examples:
    constraintd serve --listen unix:///run/constraintd.sock
    constraintd serve --listen unix:///run/constraintd.sock --listen 127.0.0.1:50051 --metrics 127.0.0.1:9464
    constraintd serve --listen 0.0.0.0:50051 --tls-cert server.pem --tls-key server.key --tls-client-ca ca.pem

SIGTERM or SIGINT begins a graceful shutdown (health NOT_SERVING, in-flight calls get --grace seconds);
a second signal exits at once. The bearer token, if any, is read from the file --token-file names, or
from the CONSTRAINTD_TOKEN environment variable.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path

from constraintd.errors import ConstraintdError
from constraintd.server.config import LogFormat, ServerConfig, TlsFiles
from constraintd.server.lifecycle import run as run_service
from constraintd.server.logs import configure
from constraintd.service.limits import Limits

TOKEN_ENVIRONMENT = "CONSTRAINTD_TOKEN"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# Limits settable from the command line: option -> (Limits field, type, help)
_LIMIT_OPTIONS: dict[str, tuple[str, type, str]] = {
    "--max-sessions": ("max_sessions", int, "open sessions at once"),
    "--max-vocabs": ("max_vocabs", int, "registered vocabularies"),
    "--max-vocab-size": ("max_vocab_size", int, "tokens in one vocabulary"),
    "--max-grammar-bytes": ("max_grammar_bytes", int, "size of a grammar, schema or request body"),
    "--max-trigger-patterns": ("max_trigger_patterns", int, "lazy trigger patterns of one constraint"),
    "--max-piece-bytes": ("max_piece_bytes", int, "length of one token's piece in a vocabulary"),
    "--max-tokens-per-call": ("max_tokens_per_call", int, "token ids in one call (Allows, replay, Step)"),
    "--max-stacks": ("max_stacks", int, "parse stacks one session may hold"),
    "--max-rollback": ("max_rollback", int, "tokens a session keeps for Rollback (its rollback window)"),
    "--max-request-bytes": ("max_request_bytes", int, "size of one gRPC message a client sends"),
    "--max-reply-bytes": ("max_reply_bytes", int, "size of one gRPC message the server sends"),
    "--max-vocab-bytes": ("max_vocab_bytes", int, "size of a vocabulary sent in parts, all parts together"),
    "--max-step-ops": ("max_step_ops", int, "operations in one Step message"),
    "--max-grammars": ("max_grammars", int, "compiled grammars kept in the shared cache"),
    "--max-grammar-cache-bytes": (
        "max_grammar_cache_bytes",
        int,
        "bytes the compiled grammars and refused constraints kept in the shared cache may hold together",
    ),
    "--session-ttl": ("default_ttl", float, "seconds a session may stay idle unless its creator says"),
    "--max-session-ttl": ("max_ttl", float, "the longest idle time a creator may ask for"),
    "--compile-timeout": ("compile_timeout", float, "seconds a compile may take"),
    "--mask-timeout": ("mask_timeout", float, "seconds a whole-vocabulary mask may take"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        action="append",
        metavar="ADDRESS",
        help="unix:///path or host:port; repeat for several (default 127.0.0.1:50051)",
    )
    parser.add_argument("--tls-cert", type=Path, help="server certificate (PEM); enables TLS")
    parser.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    parser.add_argument(
        "--tls-client-ca", type=Path, help="CA (PEM) client certificates must chain to (mTLS)"
    )
    parser.add_argument("--token-file", type=Path, help="file holding the bearer token callers must send")
    parser.add_argument(
        "--socket-mode",
        type=_mode,
        default=ServerConfig().socket_mode,
        metavar="OCTAL",
        help="permissions of the Unix sockets it listens on: 0600 lets only this user connect, 0660 its "
        "group too (default 0600; the socket is never more open than this, whatever the umask)",
    )
    parser.add_argument(
        "--metrics", metavar="HOST:PORT", help="serve Prometheus metrics at http://HOST:PORT/metrics"
    )
    parser.add_argument(
        "--gguf-dir",
        action="append",
        type=Path,
        default=[],
        help="a directory RegisterVocab may read GGUF files from; repeat for several (default: none, "
        "RegisterVocab reads no file and vocabularies are sent as pieces)",
    )
    parser.add_argument(
        "--cache-dir",
        action="append",
        type=Path,
        default=[],
        help="a directory of prepared vocabularies (constraintd warm): GGUF vocabularies are loaded from it, "
        "and saved to it when it can be written; repeat to layer a read-only one over a writable one",
    )
    parser.add_argument(
        "--warm-seconds",
        type=float,
        default=ServerConfig().warm_seconds,
        help="seconds to spend warming the masks JSON grammars share on each new vocabulary, before its "
        "registration returns; 30 covers a 262k vocabulary on one core (default %(default)s: off)",
    )
    parser.add_argument("--workers", type=int, default=2, help="threads that compile off the event loop")
    parser.add_argument(
        "--compile-processes",
        type=int,
        default=ServerConfig().compile_processes,
        help="worker processes that convert and parse grammars for those threads, off the server's GIL; "
        "0 does it in the threads (default %(default)s)",
    )
    parser.add_argument(
        "--compile-nice",
        type=int,
        choices=range(20),
        metavar="0..19",
        default=ServerConfig().compile_nice,
        help="how far below the server's priority the compile processes run: 19 keeps answers quick "
        "while a compile runs, but a compile gets little CPU while the cores are saturated (a model on "
        "the same CPU); a smaller increment lets it finish sooner (default %(default)s)",
    )
    parser.add_argument(
        "--mask-workers", type=int, default=2, help="threads that compute masks off the event loop"
    )
    parser.add_argument(
        "--lookahead-seconds",
        type=float,
        default=ServerConfig().lookahead_seconds,
        help="CPU seconds spent on each new grammar while its first session's prompt is evaluated (and "
        "nothing else is computed), learning what its first masks need; 0: off (default %(default)s)",
    )
    parser.add_argument("--grace", type=float, default=10.0, help="seconds in-flight calls get at shutdown")
    parser.add_argument(
        "--no-uvloop", action="store_true", help="use asyncio's event loop even if uvloop is there"
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=ServerConfig().switch_interval,
        help="seconds between GIL hand-overs (sys.setswitchinterval); shorter keeps answers quick while "
        "workers compile (default %(default)s)",
    )
    parser.add_argument(
        "--settle-interval",
        type=float,
        default=ServerConfig().settle_interval,
        help="seconds between looks at the server's resident size, after which memory a burst of work "
        "freed is given back to the system (a full garbage collection and malloc_trim); 0: never "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--parent-pid",
        type=int,
        metavar="PID",
        help="shut down as on SIGTERM when PID, the process that started this one, ends however it ends "
        "(Linux only: the kernel's parent-death signal)",
    )
    parser.add_argument("--log-format", choices=[f.value for f in LogFormat], default=LogFormat.JSON.value)
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    limits = parser.add_argument_group("limits")
    defaults = Limits()
    for option, (name, kind, text) in _LIMIT_OPTIONS.items():
        limits.add_argument(
            option, type=kind, default=getattr(defaults, name), help=f"{text} (default %(default)s)"
        )


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is not None:
        token = str(args.token_file.read_text(encoding="utf-8")).strip()
        if not token:
            # a Secret mounted empty would otherwise serve everyone, silently
            raise ValueError(f"--token-file {args.token_file} is empty: it would let every caller in")
        return token
    return os.environ.get(TOKEN_ENVIRONMENT) or None


def _mode(text: str) -> int:
    mode = int(text, 8)
    if not 0 <= mode <= 0o777:
        raise ValueError(text)
    return mode


def config_from(args: argparse.Namespace) -> ServerConfig:
    """The server configuration the parsed arguments describe.

    Raises:
        ValueError: a TLS certificate without its key (or the other way round), an empty token file.
        OSError: the token file cannot be read.
    """
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if args.tls_client_ca is not None and args.tls_cert is None:
        raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert is not None else None
    limits = dataclasses.replace(
        Limits(),
        **{
            name: getattr(args, option[2:].replace("-", "_"))
            for option, (name, _, _) in _LIMIT_OPTIONS.items()
        },
    )
    return ServerConfig(
        listen=tuple(args.listen or ("127.0.0.1:50051",)),
        tls=tls,
        bearer_token=_token(args),
        socket_mode=args.socket_mode,
        metrics_listen=args.metrics,
        gguf_dirs=tuple(args.gguf_dir),
        cache_dirs=tuple(args.cache_dir),
        warm_seconds=args.warm_seconds,
        workers=args.workers,
        compile_processes=args.compile_processes,
        compile_nice=args.compile_nice,
        mask_workers=args.mask_workers,
        lookahead_seconds=args.lookahead_seconds,
        shutdown_grace=args.grace,
        use_uvloop=not args.no_uvloop,
        switch_interval=args.switch_interval,
        settle_interval=args.settle_interval,
        log_format=LogFormat(args.log_format),
        limits=limits,
    )


def exit_with_parent(parent: int) -> None:
    """Has the kernel send this process SIGTERM when its parent, `parent`, ends.

    Set here, after exec, by the server itself: a parent that set it between fork and exec
    (`Popen(preexec_fn=...)`) would run Python in a forked copy of itself, where gRPC's fork handlers
    start pollers on descriptors the child is about to close (the child then aborts or hangs).

    Raises:
        ValueError: not on Linux, or `parent` is not this process's parent.
    """
    if not sys.platform.startswith("linux"):
        raise ValueError("--parent-pid needs Linux (its parent-death signal)")
    if os.getppid() != parent:
        # started by another process, or the parent is already gone: nobody would signal
        raise ValueError(f"--parent-pid {parent} is not this process's parent")
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    if prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise ValueError(f"--parent-pid: prctl failed: {os.strerror(ctypes.get_errno())}")
    if os.getppid() != parent:  # the parent died while the request took hold
        os.kill(os.getpid(), signal.SIGTERM)


def run(args: argparse.Namespace) -> int:
    try:
        if args.parent_pid is not None:
            exit_with_parent(args.parent_pid)
        config = config_from(args)
    except (ValueError, OSError) as exc:
        print(f"constraintd serve: {exc}", file=sys.stderr)
        return 2
    configure(config.log_format, getattr(logging, args.log_level))
    try:
        return run_service(config)
    except (ConstraintdError, OSError) as exc:
        logging.getLogger("constraintd.server").error("cannot serve: %s", exc)
        return 1
