# gRPC status names -> the errors a client raises: the server's mapping, read backwards, in one table.
#
# Invariants:
# - A status the server sends for a `ConstraintdError` comes back as that error's class (the base class of
#   its family: a GrammarError arrives as InputError, with the server's message, which says where).
# - ABORTED is PositionError (a retried request the session had already applied).
# - CANCELLED reaches a client only when the server cancelled the call (a client's own cancellation is
#   asyncio's CancelledError), which it does when it stops: it is UnavailableError, retried like it.
# - Any other status (UNAUTHENTICATED, INTERNAL, ...) is a `ServiceError` carrying the status name.
from __future__ import annotations

from constraintd.errors import (
    ConstraintdError,
    DeadlineError,
    InputError,
    LimitError,
    NotFoundError,
    PositionError,
    UnavailableError,
)

__all__ = ["ServiceError", "error_for"]


class ServiceError(ConstraintdError):
    """A failure with a status outside constraintd's error tree (UNAUTHENTICATED, INTERNAL, ...)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


_ERRORS: dict[str, type[ConstraintdError]] = {
    **{
        cls.status: cls
        for cls in (InputError, NotFoundError, LimitError, DeadlineError, UnavailableError, PositionError)
    },
    "CANCELLED": UnavailableError,
}


def error_for(status: str, message: str) -> ConstraintdError:
    """The error a call that failed with `status` (a gRPC status code name) raises."""
    cls = _ERRORS.get(status)
    return cls(message) if cls is not None else ServiceError(status, message)
