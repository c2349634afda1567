"""What every command test shares."""

from __future__ import annotations

import gc

import pytest


@pytest.fixture(autouse=True)
def _nothing_left_over(capsys: pytest.CaptureFixture[str]) -> None:
    # Objects an earlier test left to the garbage collector (a stopped server's coroutines) may print as
    # they are collected: collect them now, and drop what they printed, so a command's own output is
    # all a test reads.
    gc.collect()
    capsys.readouterr()
