"""`sampler-worker serve`: an OpenAI- and Ollama-compatible HTTP server, constrained through constraintd.

Examples:
    sampler-worker serve                                   # Gemma 3 270M on 127.0.0.1:8080
    sampler-worker serve --model model.gguf --listen 0.0.0.0:8000 --parallel 2
    sampler-worker serve --constraintd unix:///run/constraintd.sock
    sampler-worker serve --listen unix:///run/sampler-worker.sock

Endpoints: POST /v1/chat/completions, /v1/completions, /api/chat, /api/generate; GET /v1/models,
/health, /metrics. Without --constraintd, a private constraintd is started on a Unix socket for the
server's life (as `generate` does); `--constraintd local` runs the engine in this process.
"""
# The process's life in named steps: startup (load the model, check its vocabulary against constraintd's
# reading, reach constraintd, register the vocabulary, bind the socket), serve (uvicorn on uvloop until
# SIGINT or SIGTERM), shutdown (uvicorn closes connections within its grace; every generation still
# running is cancelled and its worker thread joined; then constraintd, then the model are released).
# State is passed explicitly (`ServeState`), never kept in module globals.
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from sampler_worker.generate import OVERLAP_MODES, Overlap

__all__ = ["LOCAL", "Listen", "add_parser", "parse_listen", "run_serve", "serving"]

LOCAL = "local"


@dataclass(frozen=True, slots=True)
class Listen:
    """Where to listen: a TCP host and port (port 0: any free one), or a Unix socket path."""

    host: str = "127.0.0.1"
    port: int = 8080
    path: str | None = None


def parse_listen(text: str) -> Listen:
    """`HOST:PORT`, `:PORT`, `[::1]:PORT` or `unix:///path` (`unix:/path`).

    Raises:
        ValueError: anything else.
    """
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        path = path[2:] if path.startswith("//") else path
        if not path:
            raise ValueError(f"no socket path in {text!r}")
        return Listen(path=path)
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen takes HOST:PORT or unix:///path, not {text!r}")
    host = host.strip("[]") or "127.0.0.1"
    return Listen(host=host, port=int(port))


def bind(listen: Listen) -> socket.socket:
    """A listening socket (before the model loads: a client connecting early waits in the backlog)."""
    if listen.path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(listen.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(listen.path)
    else:
        family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((listen.host, listen.port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def address(sock: socket.socket) -> str:
    """The URL the socket answers on."""
    name = sock.getsockname()
    if isinstance(name, str):
        return f"unix://{name}"
    host = f"[{name[0]}]" if ":" in name[0] else name[0]
    return f"http://{host}:{name[1]}"


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Register `serve` on the subcommands of `sampler-worker`'s parser."""
    from sampler_worker.model import default_threads

    serve: argparse.ArgumentParser = commands.add_parser(
        "serve", help="an OpenAI- and Ollama-compatible HTTP server", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--model", type=Path, help="GGUF model (default: Gemma 3 270M from its PyPI package)")
    serve.add_argument("--alias",
                       help="the model's name in answers and /v1/models (default: the file's name)")
    serve.add_argument("--listen", default="127.0.0.1:8080", type=parse_listen,
                       help="HOST:PORT (port 0: any free port) or unix:///path (default 127.0.0.1:8080)")
    serve.add_argument(
        "--constraintd", metavar="TARGET",
        help="`local` (in this process), or a gRPC target such as unix:///run/constraintd.sock "
        "(default: a private server on a Unix socket for the server's life)",
    )
    serve.add_argument("--parallel", type=int, default=1,
                       help="generations at once: above 1, sequences of one llama.cpp context decoded "
                       "together, one constraintd Step message per step (default 1)")
    serve.add_argument(
        "--overlap", choices=OVERLAP_MODES, default="auto",
        help="how generations meet constraintd, as `generate --overlap`: ahead fetches the next mask while "
        "the model evaluates a token, off accepts each draw; auto (default) is generate's per generation "
        "with --parallel 1 (ahead unless waits prove off faster), and ahead with more (every lane's mask "
        "in one Step message per decode)",
    )
    serve.add_argument(
        "--honour-strict", action="store_true",
        help="OpenAI's response_format.json_schema.strict: true refuses (400, naming the keyword and its "
        "pointer) a schema the grammar cannot enforce in full; without it the grammar is llama.cpp's and "
        "may accept more than the schema",
    )
    serve.add_argument("--chat-template", type=Path, metavar="FILE",
                       help="a Jinja chat template used instead of the model's, for every chat "
                       "(llama-server's --chat-template-file)")
    from sampler_worker.cli import add_reasoning_budget_options

    add_reasoning_budget_options(serve, scope="an OpenAI chat completion that sets none")
    serve.add_argument("--max-queue", type=int, default=8,
                       help="requests that may wait for a free slot; past it, 429 with Retry-After "
                       "(default 8)")
    serve.add_argument("--timeout", type=float, default=600.0,
                       help="seconds a request may take, waiting included (default 600)")
    serve.add_argument("--n-ctx", type=int, default=4096,
                       help="context size in tokens, per slot (default 4096)")
    serve.add_argument("--threads", type=int,
                       help=f"CPU threads for the model, shared by the slots (default {default_threads()} "
                       "here)")
    serve.add_argument("--contexts", type=int, default=1,
                       help="llama.cpp contexts the --parallel sequences are spread over, each with its "
                       "share of --threads and a thread stepping it (default 1, llama-server's layout: one "
                       "decode a step for every sequence); more suits cores shared with other work, where "
                       "the threads of one context wait on each other")
    return serve


class _Serialized:
    # The in-process transport is the service core called directly, made for one caller at a time; the
    # server's worker threads take turns (its calls are short: an accept, a mask).
    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._lock = threading.Lock()
        self.operations = transport.operations

    def call(self, method: str, request: Any, *, timeout: float | None) -> Any:
        with self._lock:
            return self._transport.call(method, request, timeout=timeout)

    def close(self) -> None:
        self._transport.close()


@contextlib.contextmanager
def _constraintd(target: str | None, say: TextIO) -> Iterator[Any]:
    from clients import Client
    from clients.transports import LocalTransport
    from sampler_worker.sidecar import PrivateConstraintd

    if target == LOCAL:
        with Client(LOCAL, transport=_Serialized(LocalTransport())) as client:
            yield client
    elif target is None:
        say.write("starting a private constraintd\n")
        with PrivateConstraintd() as server, Client(server.target) as client:
            yield client
    else:
        with Client(target) as client:
            yield client


@contextlib.contextmanager
def serving(
    *,
    model_path: Path | None = None,
    constraintd: str | None = None,
    parallel: int = 1,
    max_queue: int = 8,
    timeout: float = 600.0,
    n_ctx: int = 4096,
    threads: int | None = None,
    groups: int = 1,
    alias: str | None = None,
    overlap: Overlap = "auto",
    honour_strict: bool = False,
    template: str | None = None,
    reasoning_budget: int = -1,
    reasoning_budget_message: str = "",
    say: TextIO = sys.stderr,
) -> Iterator[Any]:
    """Startup and shutdown around the app: yields the FastAPI app, ready to serve.

    The model is loaded and its vocabulary checked against constraintd's reading of the same GGUF, then
    registered; leaving the block cancels every generation, joins the worker threads, and releases
    constraintd and the model, in that order. `template`: a chat template (Jinja source) used instead of
    the model's; `reasoning_budget` and its message: a chat's when its request sets none.

    Raises:
        ModelError, SidecarError, ConstraintdError: the model, or constraintd, cannot be had.
    """
    from constraintd.engine.vocab.vocab import Vocab
    from sampler_worker.model import Model, ModelError, check_vocab, default_model_path, default_threads
    from sampler_worker.serve.app import ServeState, create_app
    from sampler_worker.serve.contexts import Slot, contexts
    from sampler_worker.serve.generations import Generations
    from sampler_worker.serve.metrics import Metrics

    if parallel < 1:
        raise ValueError(f"--parallel must be at least 1, not {parallel}")
    if groups < 1:
        raise ValueError(f"--contexts must be at least 1, not {groups}")
    if max_queue < 0:
        raise ValueError(f"--max-queue must not be negative, not {max_queue}")
    if reasoning_budget < -1:
        raise ValueError(f"--reasoning-budget must be -1 (no limit) or more, not {reasoning_budget}")
    path = model_path if model_path is not None else default_model_path()
    threads = threads or default_threads()
    say.write(f"loading {path}\n")
    with Model(path, n_ctx=n_ctx, n_threads=threads) as model:
        vocab = Vocab.from_gguf(path)
        check_vocab(model, vocab.pieces, vocab.eog_ids)
        slots = contexts(model, parallel, threads=threads, groups=groups)
        try:
            with _constraintd(constraintd, say) as client:
                handle = client.register_vocab(gguf=Path(path).resolve())
                if handle.content_hash != vocab.content_hash:
                    raise ModelError("constraintd read a different vocabulary from the GGUF than this worker")
                metrics = Metrics()
                generations = Generations(slots, client=client, vocab=handle, max_queue=max_queue,
                                          metrics=metrics, overlap=overlap, template=template,
                                          reasoning_budget=reasoning_budget,
                                          reasoning_budget_message=reasoning_budget_message)
                state = ServeState(generations, metrics, alias or Path(path).name, timeout, honour_strict)
                app = create_app(state)
                app.state.serve = state
                try:
                    yield app
                finally:
                    generations.close()
        finally:
            for slot in slots:
                if isinstance(slot, Slot):
                    slot.batched.close()  # idempotent: each context once, whatever its slots


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop where it is installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def uvicorn_server(app: Any, *, log_level: str = "warning") -> Any:
    """A uvicorn server for the app (HTTP only, no lifespan: startup and shutdown are `serving`'s)."""
    import uvicorn

    config = uvicorn.Config(app, loop="none", ws="none", lifespan="off", log_level=log_level,
                            timeout_graceful_shutdown=5, access_log=False)
    return uvicorn.Server(config)


class _Terminated(Exception):
    """SIGTERM: uvicorn stops serving on it, then raises it again once done; it ends here, cleanly."""


def _terminated(signum: int, frame: object) -> None:
    raise _Terminated


def run_serve(args: argparse.Namespace, say: TextIO = sys.stderr) -> int:
    """Run `sampler-worker serve` until SIGINT or SIGTERM; the exit status (0 after SIGTERM)."""
    if args.parallel < 1:
        raise ValueError(f"--parallel must be at least 1, not {args.parallel}")
    # uvicorn catches SIGTERM while it serves and raises it again after its shutdown; a Python handler
    # turns that into an exception, so the startup's resources (a private constraintd, the model) are
    # released on the way out instead of the process dying with them.
    template = None
    if args.chat_template is not None:
        try:
            template = args.chat_template.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"{args.chat_template}: {exc.strerror}") from exc
    previous = signal.signal(signal.SIGTERM, _terminated)
    sock = bind(args.listen)
    try:
        with serving(
            model_path=args.model, constraintd=args.constraintd, parallel=args.parallel,
            max_queue=args.max_queue, timeout=args.timeout, n_ctx=args.n_ctx, threads=args.threads,
            groups=args.contexts, alias=args.alias, overlap=args.overlap, honour_strict=args.honour_strict,
            template=template, reasoning_budget=args.reasoning_budget,
            reasoning_budget_message=args.reasoning_budget_message, say=say,
        ) as app:
            server = uvicorn_server(app)
            say.write(f"listening on {address(sock)}\n")
            say.flush()
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                runner.run(server.serve(sockets=[sock]))
    except _Terminated:
        say.write("stopped\n")
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        if args.listen.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(args.listen.path)
    return 0
