"""Every error constraintd raises on purpose.

    ConstraintdError                 (base; never raised itself)
    ├── InputError                   bad input from a caller           -> INVALID_ARGUMENT
    │   ├── GrammarError             a GBNF text llama.cpp refuses (line, column, the text around it)
    │   ├── SchemaError              a JSON schema or request refused (JSON pointer of the node)
    │   ├── VocabError               a vocabulary that cannot be read or used
    │   ├── TokenError               a token id outside the vocabulary
    │   ├── ChatTemplateError        a chat template that does not render the request
    │   ├── FreeTextError            a chat request that asks for free text: nothing to hold
    │   └── NotPortedError           a chat request needing what is not ported of llama.cpp's chat layer
    ├── NotFoundError                an unknown session or vocabulary  -> NOT_FOUND
    ├── PositionError                a request for another point of a session -> ABORTED
    ├── LimitError                   a configured limit reached        -> RESOURCE_EXHAUSTED
    ├── DeadlineError                work that ran past its time limit -> DEADLINE_EXCEEDED
    └── UnavailableError             the service cannot answer now     -> UNAVAILABLE

Each class names the gRPC status it maps to as a string, so the engine (which never imports grpc)
and the server (which maps the name to `grpc.StatusCode` in one place) agree. Anything raised that is
not a `ConstraintdError` is a bug: the server answers INTERNAL and logs the traceback.

An error travels as its class name, its message and its parts (`PARTS`: a GrammarError's reason, line,
column and excerpt, a SchemaError's reason and pointer), and is made again on the other side by
`ERRORS_BY_NAME[name].from_parts(message, parts)`: the same class, message and attributes. Nothing here
knows the wire (constraintd/service/status.py writes the google.rpc.Status, clients/status.py reads it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

__all__ = [
    "DOMAIN",
    "ERRORS_BY_NAME",
    "ChatTemplateError",
    "ConstraintdError",
    "DeadlineError",
    "FreeTextError",
    "GrammarError",
    "InputError",
    "LimitError",
    "NotFoundError",
    "NotPortedError",
    "PositionError",
    "SchemaError",
    "TokenError",
    "UnavailableError",
    "VocabError",
]


class ConstraintdError(Exception):
    """Base of every expected error; `status` is the gRPC status code name it maps to."""

    status = "UNKNOWN"
    # The attributes that say what and where, with their types (the message is made from them).
    PARTS: ClassVar[Mapping[str, type[str] | type[int]]] = {}

    def parts(self) -> dict[str, str]:
        """The error's parts (`PARTS`) as text, by name; empty for an error that has none."""
        return {name: str(getattr(self, name)) for name in self.PARTS}

    @classmethod
    def from_parts(cls, message: str, parts: Mapping[str, str]) -> Self:
        """The error with this message and these parts (as `parts()` gives them), as it was raised.

        A part missing from `parts` keeps the class's default.

        Raises:
            ValueError: a part that is not text of its type (a line that is not a number).
        """
        attributes = {name: kind(parts[name]) for name, kind in cls.PARTS.items() if name in parts}
        return cls.rebuilt((message,), attributes)

    @classmethod
    def rebuilt(cls, args: tuple[Any, ...], attributes: dict[str, Any]) -> Self:
        """The error raised before (in another process, or earlier) with these `args` and attributes.

        Not cls(*args): a subclass's constructor takes its parts (reason, pointer) and writes its own
        message from them; the message it wrote, and the parts, are restored as they were.
        """
        error = cls.__new__(cls, *args)
        error.args = args
        vars(error).update(attributes)
        return error


class InputError(ConstraintdError):
    """The caller sent something that cannot be used."""

    status = "INVALID_ARGUMENT"


class GrammarError(InputError):
    """A GBNF grammar refused, with where.

    Attributes:
        reason: what is wrong, in llama.cpp's words where llama.cpp has them.
        line: 1-based line of the offending spot (0 when the error is not at one spot).
        column: 1-based column, counted in characters.
        excerpt: the text around the spot.
    """

    PARTS: ClassVar[Mapping[str, type[str] | type[int]]] = {
        "reason": str,
        "line": int,
        "column": int,
        "excerpt": str,
    }
    # defaults for an error made again from parts that lack some (see ConstraintdError.from_parts)
    reason = ""
    line = 0
    column = 0
    excerpt = ""

    def __init__(self, reason: str, *, line: int = 0, column: int = 0, excerpt: str = "") -> None:
        self.reason = reason
        self.line = line
        self.column = column
        self.excerpt = excerpt
        where = f" at line {line}, column {column}" if line else ""
        near = f": {excerpt!r}" if excerpt else ""
        super().__init__(f"{reason}{where}{near}")


class SchemaError(InputError):
    """A JSON schema (or a request carrying one) refused, with the JSON pointer of the node.

    Attributes:
        reason: what is wrong, in llama.cpp's words where llama.cpp has them.
        pointer: JSON pointer of the offending node, `#` for the root.
    """

    PARTS: ClassVar[Mapping[str, type[str] | type[int]]] = {"reason": str, "pointer": str}
    reason = ""
    pointer = "#"

    def __init__(self, reason: str, *, pointer: str = "#") -> None:
        self.reason = reason
        self.pointer = pointer
        super().__init__(f"{reason} (at {pointer})")


class VocabError(InputError):
    """A vocabulary that cannot be read or used."""


class TokenError(InputError):
    """A token id outside the vocabulary."""


class ChatTemplateError(InputError):
    """A chat request whose template does not render it (the message is the template's error)."""


class FreeTextError(InputError):
    """A chat request that asks for free text (no tools the template can call, tool_choice none, or auto
    with no word to trigger on): there is no constraint for a session to hold. Its caller generates the
    text unconstrained, as llama-server does."""


class NotPortedError(InputError):
    """A chat request that needs a part of llama.cpp's chat layer not ported yet.

    Attributes:
        what: the part, in words (the message is "not ported yet: " and these).
    """

    PARTS: ClassVar[Mapping[str, type[str] | type[int]]] = {"what": str}
    what = ""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"not ported yet: {what}")


class NotFoundError(ConstraintdError):
    """An unknown (or expired) session or vocabulary."""

    status = "NOT_FOUND"


class PositionError(ConstraintdError):
    """A request's `position` differs from the session's: a retried request that was already applied.

    The client's own record of the accepted tokens is the truth: it rebuilds the session from them.
    """

    status = "ABORTED"


class LimitError(ConstraintdError):
    """A configured limit was reached (sessions, sizes, stacks)."""

    status = "RESOURCE_EXHAUSTED"


class DeadlineError(ConstraintdError):
    """Work ran past its time limit (a compile, a conversion)."""

    status = "DEADLINE_EXCEEDED"


class UnavailableError(ConstraintdError):
    """The service cannot answer now (shutting down)."""

    status = "UNAVAILABLE"


# The name of this tree among others, where errors of many services meet (a google.rpc.ErrorInfo's domain).
DOMAIN = "constraintd"

# Every class of the tree by its name: how an error that travelled as its name is made again.
ERRORS_BY_NAME: dict[str, type[ConstraintdError]] = {
    cls.__name__: cls
    for cls in (
        ConstraintdError,
        InputError,
        GrammarError,
        SchemaError,
        VocabError,
        TokenError,
        ChatTemplateError,
        FreeTextError,
        NotPortedError,
        NotFoundError,
        PositionError,
        LimitError,
        DeadlineError,
        UnavailableError,
    )
}
