# How the service logs: an event name as the message, its facts as fields.
#
# Contract: `log.info("vocabulary read", extra=fields(gguf=path, tokens=n))` puts the facts where the
# server's formatter (server/logs.py) writes them, one key each; a process that never configures that
# formatter still gets the event name. Nothing here configures logging: only a process's entry point does.
from __future__ import annotations

from typing import Any

__all__ = ["fields"]


def fields(**values: Any) -> dict[str, Any]:
    """The `extra` argument of a logging call that carries these fields."""
    return {"fields": values}
