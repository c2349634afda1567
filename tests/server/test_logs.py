"""Structured logs (constraintd/server/logs.py): one JSON object per line, with the event's fields."""

from __future__ import annotations

import json
import logging
import sys

from constraintd.server.logs import JsonFormatter
from constraintd.service.log_events import fields


def record(message: str, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("constraintd.server", logging.WARNING, __file__, 1, message, None, None)
    for name, value in extra.items():
        setattr(made, name, value)
    return made


def test_a_record_is_one_json_line_with_its_fields() -> None:
    line = JsonFormatter().format(record("serving", **fields(addresses=["unix:///s"], port=9464)))
    assert "\n" not in line
    entry = json.loads(line)
    assert (
        entry["level"] == "warning"
        and entry["logger"] == "constraintd.server"
        and entry["event"] == "serving"
    )
    assert entry["addresses"] == ["unix:///s"] and entry["port"] == 9464
    assert entry["time"].endswith("Z")


def test_values_json_cannot_hold_are_written_as_their_repr_and_tracebacks_are_kept() -> None:
    try:
        raise KeyError("bug")
    except KeyError:
        failing = record("internal error", **fields(where=object), exc_info=sys.exc_info())
    entry = json.loads(JsonFormatter().format(failing))
    assert entry["where"] == repr(object)
    assert "KeyError: 'bug'" in entry["traceback"]
