# Errors as the HTTP server answers them: OpenAI's error object for the /v1 endpoints, Ollama's for /api.
#
# Contract:
# - `http_error(exc)` is the one place an exception becomes an HTTP status; the table below decides, the
#   first class that matches wins. Anything not in it is a bug: 500, `server_error`.
# - A refused grammar keeps its line and column in the message; a refused schema or request field keeps
#   its JSON pointer in the message and as `param` (OpenAI clients show both).
# - 429 (queue full) and 503 (constraintd unreachable, silent past its call's deadline, or at a limit)
#   carry `Retry-After`.
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from constraintd.engine.chat.params.chat_params import NotPorted
from constraintd.errors import (
    ConstraintdError,
    DeadlineError,
    GrammarError,
    InputError,
    LimitError,
    SchemaError,
    UnavailableError,
)
from sampler_worker.prompt import TemplateError
from sampler_worker.serve.bodies import RequestError
from sampler_worker.serve.generations import ContextLengthError, DeadlinePassed, QueueFull

__all__ = ["HttpError", "http_error"]

_RETRY_SECONDS = 1

# exception class -> (HTTP status, OpenAI error type, code); the first match decides
_STATUSES: tuple[tuple[type[BaseException], int, str, str | None], ...] = (
    (ContextLengthError, 400, "invalid_request_error", "context_length_exceeded"),
    (RequestError, 400, "invalid_request_error", None),
    (ValidationError, 400, "invalid_request_error", None),
    (UnicodeDecodeError, 400, "invalid_request_error", None),
    (GrammarError, 400, "invalid_request_error", "invalid_grammar"),
    (SchemaError, 400, "invalid_request_error", "invalid_schema"),
    (InputError, 400, "invalid_request_error", None),
    (TemplateError, 400, "invalid_request_error", "invalid_template"),
    # a chat template whose tool calls (or their grammar, or their parser) are not ported: the request's
    # tools cannot be served on it, said before any work
    (NotPorted, 400, "invalid_request_error", "not_supported"),
    (QueueFull, 429, "rate_limit_error", "rate_limit_exceeded"),
    (UnavailableError, 503, "service_unavailable", "constraintd_unavailable"),
    # The client waits for an unreachable constraintd until its call's deadline: to this server's client
    # that is constraintd unavailable, not its own request running out of time.
    (DeadlineError, 503, "service_unavailable", "constraintd_unavailable"),
    (LimitError, 503, "service_unavailable", "constraintd_limit"),
    (DeadlinePassed, 504, "timeout_error", "deadline_exceeded"),
    (ConstraintdError, 502, "server_error", "constraintd_error"),
)


@dataclass(frozen=True, slots=True)
class HttpError:
    """An error answer.

    Attributes:
        status: the HTTP status.
        message: what is wrong, and where.
        type: OpenAI's error type (`invalid_request_error`, ...).
        param: the request field at fault (a JSON pointer for a constraint), or None.
        code: a short machine-readable code, or None.
        retry_after: seconds for the `Retry-After` header, or None.
    """

    status: int
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    retry_after: int | None = None

    def openai(self) -> dict[str, Any]:
        """The body OpenAI clients read: `{"error": {"message", "type", "param", "code"}}`."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def ollama(self) -> dict[str, Any]:
        """The body Ollama clients read: `{"error": message}`."""
        return {"error": self.message}

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


def _validation_message(exc: ValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return (f"{where}: {first['msg']}" if where else first["msg"]), (where or None)


def _param(exc: BaseException) -> str | None:
    if isinstance(exc, SchemaError):
        return exc.pointer
    if isinstance(exc, GrammarError):
        return "grammar"
    if isinstance(exc, RequestError):
        return exc.param
    return None


def http_error(exc: BaseException) -> HttpError:
    """The HTTP answer for an exception (see the table above)."""
    row = next((row for row in _STATUSES if isinstance(exc, row[0])), None)
    if row is None:
        return HttpError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")
    _, status, kind, code = row
    message, param = str(exc), _param(exc)
    if isinstance(exc, ValidationError):
        message, param = _validation_message(exc)
    elif isinstance(exc, UnicodeDecodeError):
        message = "the request body is not UTF-8 text"
    elif status == 503:
        message = f"constraintd cannot serve the request now: {message}"
    elif isinstance(exc, NotPorted):
        message, param = f"not supported on this chat template: {message}", "tools"
    if isinstance(exc, SchemaError) and exc.pointer and exc.pointer not in message:
        message = f"{message} (at {exc.pointer})"
    retry = exc.retry_after if isinstance(exc, QueueFull) else _RETRY_SECONDS if status == 503 else None
    return HttpError(status, message, kind, param, code, retry)
