"""Fixtures of the chat layer's tests: llama.cpp's chat layer as an oracle."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chat_oracle.build import harness_binary


@pytest.fixture(scope="session")
def chat_oracle(pytestconfig: pytest.Config) -> Path:
    """llama.cpp's chat layer, built from the reference on first use (about ten minutes, then cached)."""
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")

    def progress(line: str) -> None:
        # the build is long: say so on the terminal even while output is captured
        if reporter is None or capture is None:
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(line)

    return harness_binary(progress=progress)
