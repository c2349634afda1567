# A `ConstraintdError` as a `google.rpc.Status`: the one encoder of errors for the wire.
#
# Invariants:
# - `code` is the number of the gRPC status the error's class names (google.rpc.Code numbers them as
#   grpc.StatusCode does), `message` is the error's message, unchanged.
# - `details` holds one google.rpc.ErrorInfo: reason = the error's class name ("GrammarError"), domain
#   "constraintd", metadata = the error's parts as text (`ConstraintdError.parts`). clients/status.py reads
#   it back into the same class with the same attributes; nothing else is needed to make the error again.
# - An error that says where in its input (a grammar's line and column, a schema's JSON pointer) also
#   carries a google.rpc.BadRequest with one field violation: `field` is that place, `description` the
#   reason, so a client that knows nothing of constraintd can still show where.
# - No grpc here: a failed unary call sends this Status (the server's `status_of` hands it to grpc), and a
#   failed Step operation answers it in its place in the response, for every transport alike.
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.rpc import code_pb2, error_details_pb2, status_pb2

from constraintd.errors import DOMAIN, ConstraintdError, GrammarError, SchemaError

__all__ = ["status_for"]

# google.rpc.Code's numbers by name: "INVALID_ARGUMENT" -> 3, the numbers of grpc.StatusCode.
_CODES: dict[str, int] = dict(code_pb2.Code.items())


# Where in its input an error is, by class: the field of its BadRequest violation (None: at no one place).
_WHERE: dict[type[ConstraintdError], Callable[[Any], str | None]] = {
    GrammarError: lambda error: f"line {error.line}, column {error.column}" if error.line else None,
    SchemaError: lambda error: error.pointer,
}


def status_for(error: ConstraintdError) -> status_pb2.Status:
    """The google.rpc.Status of `error`: its code, its message, and its class and parts as details."""
    status = status_pb2.Status(code=_CODES.get(error.status, code_pb2.UNKNOWN), message=str(error))
    name = type(error).__name__
    status.details.add().Pack(
        error_details_pb2.ErrorInfo(reason=name, domain=DOMAIN, metadata=error.parts())
    )
    where = next((find(error) for cls, find in _WHERE.items() if isinstance(error, cls)), None)
    if where is not None:
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=where, description=getattr(error, "reason", str(error)), reason=name
        )
        status.details.add().Pack(error_details_pb2.BadRequest(field_violations=[violation]))
    return status
