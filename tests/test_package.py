"""The top-level package: its public names, its typing marker, its errors' statuses."""

from __future__ import annotations

from importlib.resources import files

import pytest

import constraintd
from constraintd import errors


def test_public_names() -> None:
    assert sorted(constraintd.__all__) == ["ConstraintdError", "__version__"]


@pytest.mark.parametrize("package", ["constraintd", "clients", "sampler_worker"], ids=str)
def test_packages_ship_py_typed(package: str) -> None:
    assert files(package).joinpath("py.typed").is_file()


STATUSES = {
    "InputError": "INVALID_ARGUMENT",
    "GrammarError": "INVALID_ARGUMENT",
    "SchemaError": "INVALID_ARGUMENT",
    "VocabError": "INVALID_ARGUMENT",
    "TokenError": "INVALID_ARGUMENT",
    "ChatTemplateError": "INVALID_ARGUMENT",
    "FreeTextError": "INVALID_ARGUMENT",
    "NotPortedError": "INVALID_ARGUMENT",
    "NotFoundError": "NOT_FOUND",
    "PositionError": "ABORTED",
    "LimitError": "RESOURCE_EXHAUSTED",
    "DeadlineError": "DEADLINE_EXCEEDED",
    "UnavailableError": "UNAVAILABLE",
}


@pytest.mark.parametrize(("name", "status"), sorted(STATUSES.items()), ids=sorted(STATUSES))
def test_each_error_names_its_status(name: str, status: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, errors.ConstraintdError)
    assert cls.status == status


def test_every_error_is_listed() -> None:
    assert sorted(errors.__all__) == sorted([*STATUSES, "ConstraintdError", "DOMAIN", "ERRORS_BY_NAME"])


def test_every_error_is_found_by_its_name() -> None:
    by_name = {name: getattr(errors, name) for name in [*STATUSES, "ConstraintdError"]}
    assert by_name == errors.ERRORS_BY_NAME


@pytest.mark.parametrize(
    "error",
    [
        errors.GrammarError("expecting name", line=3, column=7, excerpt="::= x"),
        errors.SchemaError("Unrecognized schema", pointer="#/properties/a/items"),
        errors.NotFoundError("no open session s1"),
    ],
    ids=["grammar", "schema", "not-found"],
)
def test_an_error_is_made_again_from_its_message_and_parts(error: errors.ConstraintdError) -> None:
    again = type(error).from_parts(str(error), error.parts())
    assert type(again) is type(error) and str(again) == str(error) and vars(again) == vars(error)


def test_parts_are_text_and_missing_parts_are_the_defaults() -> None:
    error = errors.GrammarError("expecting name", line=3, column=7)
    assert error.parts() == {"reason": "expecting name", "line": "3", "column": "7", "excerpt": ""}
    bare = errors.SchemaError.from_parts("refused", {})
    assert (bare.reason, bare.pointer, str(bare)) == ("", "#", "refused")
    with pytest.raises(ValueError):
        errors.GrammarError.from_parts("m", {"line": "three"})


def test_grammar_error_says_where() -> None:
    error = errors.GrammarError("expecting name", line=3, column=7, excerpt="::= x")
    assert str(error) == "expecting name at line 3, column 7: '::= x'"


def test_schema_error_says_where() -> None:
    error = errors.SchemaError("Unrecognized schema", pointer="#/properties/a/items")
    assert str(error) == "Unrecognized schema (at #/properties/a/items)"
