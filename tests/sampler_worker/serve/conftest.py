"""A live `sampler-worker serve` for the tests: uvicorn in a thread on 127.0.0.1, port 0.

The socket is bound and listening before the server thread starts, so a client may connect at once: the
connection waits in the socket's backlog until uvicorn accepts it (nothing polls or sleeps for readiness).
The server is the command's own startup (`serving`), with constraintd in-process, one slot and no queue:
a second request while one runs is refused (429), which the queue test relies on.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sampler_worker.serve.app import ServeState
from sampler_worker.serve.command import Listen, address, bind, loop_factory, serving, uvicorn_server

# A grammar whose first draws the model often gets wrong (a rejection, a mask) and that ends soon.
ANSWER_GRAMMAR = 'root ::= "Answer: " [0-9]+ "."'
QUESTION = "What is 6 times 7?"


@dataclass
class LiveServer:
    url: str
    state: ServeState
    loop: asyncio.AbstractEventLoop

    def http(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, **kwargs)

    def wait_idle(self, timeout: float = 120) -> None:
        """Block until every generation's worker thread has ended (a condition, not a sleep)."""
        future = asyncio.run_coroutine_threadsafe(self.state.generations.wait_idle(), self.loop)
        future.result(timeout)

    def open_sessions(self) -> int:
        """constraintd sessions open now (the in-process service's store)."""
        return len(self.state.generations.client.transport.operations.store)


@contextlib.contextmanager
def live_server(model_path: Path, **options: Any) -> Iterator[LiveServer]:
    """`serving(...)` behind uvicorn on a free port of 127.0.0.1, in a thread, for a `with` block."""
    with serving(model_path=model_path, constraintd="local", **options) as app:
        sock = bind(Listen(port=0))
        server = uvicorn_server(app)
        loop = loop_factory()()
        thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(sockets=[sock]),))
        thread.start()
        try:
            yield LiveServer(address(sock), app.state.serve, loop)
        finally:
            server.should_exit = True
            thread.join(timeout=60)
            loop.close()
            sock.close()


@pytest.fixture(scope="session")
def server(gemma_path: Path) -> Iterator[LiveServer]:
    """One slot, no queue, constraintd in-process."""
    with live_server(gemma_path, parallel=1, max_queue=0, timeout=300, n_ctx=1024) as live:
        yield live


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with server.http() as client:
        yield client
    server.wait_idle()
