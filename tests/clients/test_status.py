"""Statuses back to errors (clients/status.py), and the clients package's public names."""

from __future__ import annotations

import pytest

from clients.status import ServiceError, error_for
from constraintd.errors import (
    ConstraintdError,
    DeadlineError,
    InputError,
    LimitError,
    NotFoundError,
    PositionError,
    UnavailableError,
)

CASES = {
    "INVALID_ARGUMENT": InputError,
    "NOT_FOUND": NotFoundError,
    "RESOURCE_EXHAUSTED": LimitError,
    "DEADLINE_EXCEEDED": DeadlineError,
    "UNAVAILABLE": UnavailableError,
    "ABORTED": PositionError,
    "CANCELLED": UnavailableError,
}


@pytest.mark.parametrize("status", list(CASES), ids=list(CASES))
def test_each_status_of_the_tree_comes_back_as_its_error(status: str) -> None:
    error = error_for(status, "what happened")
    assert type(error) is CASES[status]
    assert str(error) == "what happened"


def test_other_statuses_are_service_errors_with_their_name() -> None:
    error = error_for("UNAUTHENTICATED", "missing or wrong bearer token")
    assert isinstance(error, ServiceError) and isinstance(error, ConstraintdError)
    assert error.status == "UNAUTHENTICATED"
    assert str(error) == "UNAUTHENTICATED: missing or wrong bearer token"
