# Statuses back to the errors a client raises: the one decoder of the server's google.rpc.Status.
#
# Invariants:
# - A status the server sends for a `ConstraintdError` (constraintd/service/status.py wrote it) comes back
#   as that error's own class, with its message and its parts (a GrammarError's reason, line, column and
#   excerpt; a SchemaError's reason and pointer): what the in-process transport raises, over every
#   transport, for a failed call and for a failed Step operation alike.
# - A status without constraintd's ErrorInfo (a server of another version, grpc's own statuses) comes back
#   by its code: the base class of its family (INVALID_ARGUMENT is InputError) with the status's message.
#   So does one whose ErrorInfo names a class of another code, or parts that cannot be read.
# - ABORTED is PositionError (a retried request the session had already applied).
# - CANCELLED reaches a client only when the server cancelled the call (a client's own cancellation is
#   asyncio's CancelledError), which it does when it stops: it is UnavailableError, retried like it.
# - Any other status (UNAUTHENTICATED, INTERNAL, ...) is a `ServiceError` carrying the status name.
from __future__ import annotations

from google.rpc import code_pb2, error_details_pb2, status_pb2

from constraintd.errors import (
    DOMAIN,
    ERRORS_BY_NAME,
    ConstraintdError,
    DeadlineError,
    InputError,
    LimitError,
    NotFoundError,
    PositionError,
    UnavailableError,
)

__all__ = ["ServiceError", "error_for", "error_from"]


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
    """The error a call that failed with `status` (a gRPC status code name) and no details raises."""
    cls = _ERRORS.get(status)
    return cls(message) if cls is not None else ServiceError(status, message)


def error_from(status: status_pb2.Status) -> ConstraintdError:
    """The error a call (or a Step operation) that failed with this google.rpc.Status raises: the class
    its ErrorInfo names, with its message and parts, or else the error its code maps to (`error_for`).

    Does not raise: a status it cannot read as one of constraintd's errors is read by its code.
    """
    code = code_pb2.Code.Name(status.code) if status.code in code_pb2.Code.values() else "UNKNOWN"
    info = error_details_pb2.ErrorInfo()
    for detail in status.details:
        if detail.Unpack(info) and info.domain == DOMAIN:
            cls = ERRORS_BY_NAME.get(info.reason)
            if cls is not None and cls.status == code:
                try:
                    return cls.from_parts(status.message, info.metadata)
                except ValueError:  # parts that are not what the class holds: a status of another version
                    break
            break
    return error_for(code, status.message)
