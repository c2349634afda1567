"""Statuses back to errors (clients/status.py): the server's google.rpc.Status as the error it was."""

from __future__ import annotations

import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2

from clients.status import ServiceError, error_for, error_from
from constraintd.errors import (
    ERRORS_BY_NAME,
    ConstraintdError,
    DeadlineError,
    GrammarError,
    InputError,
    LimitError,
    NotFoundError,
    NotPortedError,
    PositionError,
    SchemaError,
    UnavailableError,
)
from constraintd.service.status import status_for

CASES = {
    "INVALID_ARGUMENT": InputError,
    "NOT_FOUND": NotFoundError,
    "RESOURCE_EXHAUSTED": LimitError,
    "DEADLINE_EXCEEDED": DeadlineError,
    "UNAVAILABLE": UnavailableError,
    "ABORTED": PositionError,
    "CANCELLED": UnavailableError,
}

# One error of every class of the tree, as the server raises it.
RAISED: dict[str, ConstraintdError] = {
    name: cls("what happened") for name, cls in ERRORS_BY_NAME.items() if not cls.PARTS
} | {
    "GrammarError": GrammarError("expecting name", line=3, column=7, excerpt="::= x"),
    "GrammarError-nowhere": GrammarError("undefined rule"),
    "SchemaError": SchemaError("Unrecognized schema", pointer="#/properties/a/items"),
    "NotPortedError": NotPortedError("the qwen3-coder format's chat params"),
}


def info_status(code: int, message: str, **info: object) -> status_pb2.Status:
    status = status_pb2.Status(code=code, message=message)
    status.details.add().Pack(error_details_pb2.ErrorInfo(**info))  # type: ignore[arg-type]
    return status


@pytest.mark.parametrize("error", list(RAISED.values()), ids=list(RAISED))
def test_every_error_comes_back_as_its_class_with_its_parts(error: ConstraintdError) -> None:
    back = error_from(status_for(error))
    assert type(back) is type(error)
    assert str(back) == str(error) and back.args == error.args
    assert vars(back) == vars(error)


def test_every_class_of_the_tree_is_covered() -> None:
    assert {type(error) for error in RAISED.values()} == set(ERRORS_BY_NAME.values())


@pytest.mark.parametrize("status", list(CASES), ids=list(CASES))
def test_each_status_of_the_tree_comes_back_as_its_error(status: str) -> None:
    for error in (
        error_for(status, "what happened"),
        error_from(status_pb2.Status(code=code_pb2.Code.Value(status), message="what happened")),
    ):
        assert type(error) is CASES[status]
        assert str(error) == "what happened"


def test_other_statuses_are_service_errors_with_their_name() -> None:
    error = error_for("UNAUTHENTICATED", "missing or wrong bearer token")
    assert isinstance(error, ServiceError) and isinstance(error, ConstraintdError)
    assert error.status == "UNAUTHENTICATED"
    assert str(error) == "UNAUTHENTICATED: missing or wrong bearer token"
    internal = error_from(status_pb2.Status(code=code_pb2.INTERNAL, message="internal error"))
    assert isinstance(internal, ServiceError) and internal.status == "INTERNAL"
    assert error_from(status_pb2.Status(code=99, message="?")).status == "UNKNOWN"


PARTS = {"reason": "expecting name", "line": "3", "column": "7", "excerpt": ""}
UNREAD = {
    "another-domain": info_status(3, "m", reason="GrammarError", domain="elsewhere", metadata=PARTS),
    "another-code": info_status(5, "m", reason="GrammarError", domain="constraintd", metadata=PARTS),
    "unknown-class": info_status(3, "m", reason="NewError", domain="constraintd"),
    "unreadable-parts": info_status(
        3, "m", reason="GrammarError", domain="constraintd", metadata=PARTS | {"line": "three"}
    ),
}


@pytest.mark.parametrize("status", list(UNREAD.values()), ids=list(UNREAD))
def test_a_status_it_cannot_read_as_a_class_comes_back_by_its_code(status: status_pb2.Status) -> None:
    error = error_from(status)
    assert type(error) is CASES[code_pb2.Code.Name(status.code)]
    assert str(error) == "m"
