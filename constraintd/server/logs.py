# Structured logs: one JSON object per line (time, level, logger, event, and the event's fields), or plain
# text for a terminal.
#
# Invariants:
# - Code logs an event name as the message and its facts as `extra=fields(...)` (service/log_events.py);
#   the formatter never drops a field and never fails on a value it cannot encode (it writes its repr).
# - `configure` is called once, by the process's entry point (`constraintd serve`); library code only gets
#   loggers, so embedding the server in another process leaves that process's logging alone.
from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from constraintd.server.config import LogFormat

__all__ = ["JsonFormatter", "configure"]

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=repr, ensure_ascii=False)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = getattr(record, "fields", {})
        if extra:
            line += " " + " ".join(f"{k}={v!r}" for k, v in extra.items())
        return line


def configure(log_format: LogFormat, level: int = logging.INFO) -> None:
    """Sends the `constraintd` loggers to standard error in the given format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format is LogFormat.JSON else _TextFormatter(_TEXT_FORMAT))
    logger = logging.getLogger("constraintd")
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False
