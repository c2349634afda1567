# The in-process transports (`LocalTransport`, `AsyncLocalTransport`): the service core's own operations,
# called directly; no server, no grpc.
# - It answers exactly as a server would: the same `Operations` (decode, engine, encode) over its own
#   registry and session store, the same messages in and out, the same errors (raised as the engine's
#   `ConstraintdError`s, so a GBNF error keeps its class, line and column).
# - Compiles run inline, on the caller's thread (or event loop): in-process means no worker pool. The
#   async flavour is a real coroutine around the same calls; it awaits nothing because nothing here waits.
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from constraintd.service.limits import Limits
from constraintd.service.operations import Operations
from constraintd.service.registry import Registry
from constraintd.service.sessions import SessionStore

__all__ = ["AsyncLocalTransport", "LocalTransport"]


class LocalTransport:
    """The engine in this process, behind the service's operations."""

    def __init__(self, limits: Limits | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        limits = limits or Limits()
        self.operations = Operations(Registry(limits), SessionStore(limits, clock=clock), limits)
        ops = self.operations
        self._methods: dict[str, Callable[[Any], Any]] = {
            "RegisterVocab": ops.register_vocab,
            "CreateSession": ops.create_session,
            "Accept": ops.accept,
            "Allows": ops.allows,
            "Mask": ops.mask,
            "Rollback": ops.rollback,
            "Fork": ops.fork,
            "Close": ops.close,
            "Step": ops.step,
        }

    def call(self, method: str, request: Any, *, timeout: float | None) -> Any:
        """Answers one request; `timeout` is ignored (nothing here waits)."""
        return self._methods[method](request)

    def close(self) -> None:
        self.operations.store.release_all()


class AsyncLocalTransport:
    """`LocalTransport` for `AsyncClient`."""

    def __init__(self, limits: Limits | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._local = LocalTransport(limits, clock=clock)
        self.operations = self._local.operations

    async def call(self, method: str, request: Any, *, timeout: float | None) -> Any:
        return self._local.call(method, request, timeout=timeout)

    async def close(self) -> None:
        self._local.close()
