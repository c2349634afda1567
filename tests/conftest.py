"""Fixtures for resources only: reference files (fetched by `python -m tests.reference fetch`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests import reference

# Property tests measure behaviour, never time: on a shared two-core machine an example may take long,
# so no per-example deadline and no "too slow" health check. The other health checks stay on.
settings.register_profile("constraintd", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("constraintd")


@pytest.fixture(scope="session")
def llama_cpp_dir() -> Path:
    """The vendored llama.cpp tree of the pinned llama-cpp-python source distribution."""
    return reference.require(reference.llama_cpp_dir())


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The Gemma 3 270M GGUF (262,144-token SentencePiece vocabulary)."""
    return reference.require(reference.gemma_path())


class OracleReport:
    """Counts of comparisons against llama.cpp, printed at the end of the run ("N of N ... identical")."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], list[int]] = {}

    def add(self, what: str, subject: str, *, identical: int, total: int) -> None:
        """Record `identical` of `total` comparisons of kind `what` ("masks") on `subject` (a vocabulary)."""
        entry = self.counts.setdefault((what, subject), [0, 0])
        entry[0] += identical
        entry[1] += total


_REPORT = OracleReport()


@pytest.fixture(scope="session")
def oracle_report() -> OracleReport:
    """Where oracle tests record how many of their comparisons with llama.cpp were identical."""
    return _REPORT


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _REPORT.counts:
        return
    terminalreporter.section("identical to llama.cpp")
    rows = sorted(_REPORT.counts.items())
    what_width = max(len(what) for (what, _), _ in rows)
    subject_width = max(len(subject) for (_, subject), _ in rows)
    for (what, subject), (identical, total) in rows:
        terminalreporter.write_line(
            f"{what:<{what_width}}  {subject:<{subject_width}}  {identical:>9} of {total:<9} identical"
        )
