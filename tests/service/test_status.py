"""A ConstraintdError as the google.rpc.Status it goes on the wire as (constraintd/service/status.py)."""

from __future__ import annotations

import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2

from constraintd.errors import (
    ConstraintdError,
    GrammarError,
    LimitError,
    NotFoundError,
    SchemaError,
    TokenError,
)
from constraintd.service.status import status_for

# error -> the field of its BadRequest violation (None: it carries no BadRequest)
WHERE: dict[str, tuple[ConstraintdError, str | None]] = {
    "grammar": (GrammarError("expecting name", line=3, column=7, excerpt="::= x"), "line 3, column 7"),
    "grammar-nowhere": (GrammarError("undefined rule"), None),
    "schema": (SchemaError("Unrecognized schema", pointer="#/properties/a/items"), "#/properties/a/items"),
    "token": (TokenError("token 99 is outside the vocabulary of 20"), None),
    "not-found": (NotFoundError("no open session s1"), None),
    "limit": (LimitError("too many sessions"), None),
    "base": (ConstraintdError("base"), None),
}


Details = tuple[error_details_pb2.ErrorInfo, error_details_pb2.BadRequest | None]


def details(status: status_pb2.Status) -> Details:
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    if len(status.details) == 1:
        return info, None
    bad_request = error_details_pb2.BadRequest()
    assert len(status.details) == 2 and status.details[1].Unpack(bad_request)
    return info, bad_request


@pytest.mark.parametrize(("error", "where"), list(WHERE.values()), ids=list(WHERE))
def test_an_error_goes_as_its_code_message_class_and_parts(
    error: ConstraintdError, where: str | None
) -> None:
    status = status_for(error)
    assert status.code == code_pb2.Code.Value(error.status)
    assert status.message == str(error)
    info, bad_request = details(status)
    assert (info.reason, info.domain) == (type(error).__name__, "constraintd")
    assert dict(info.metadata) == error.parts()
    if where is None:
        assert bad_request is None
    else:
        assert bad_request is not None
        (violation,) = bad_request.field_violations
        assert (violation.field, violation.description, violation.reason) == (
            where,
            vars(error)["reason"],
            type(error).__name__,
        )


def test_a_grammar_errors_parts_are_text() -> None:
    info, _ = details(status_for(GrammarError("expecting name", line=3, column=7, excerpt="::= x")))
    assert dict(info.metadata) == {"reason": "expecting name", "line": "3", "column": "7", "excerpt": "::= x"}
