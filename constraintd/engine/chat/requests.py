# Request resolution: which constraint an OpenAI or Ollama request body asks for, resolved as llama-server
# and Ollama resolve it, and the GBNF grammar that constraint is.
#
# Contract:
# - The request is read from its own JSON text with `parse_json` (nlohmann's reading, so `2.0` stays a
#   float); a schema found in it goes to the converter as nlohmann's `dump()` of it, which is exactly what
#   llama-server hands to `json_schema_to_grammar` (`inputs.json_schema = json_schema.dump()`).
# - The OpenAI fields follow llama-server's `oaicompat_chat_params_parse` (tools/server/server-common.cpp):
#     no field, `response_format: null`, `{"type": "text"}`, `{}`    -> no constraint
#     `response_format: {"type": "json_object"}`                      -> JSON mode: any object
#     `response_format: {"type": "json_object", "schema": S}`         -> the schema S
#     `response_format: {"type": "json_schema", "json_schema": {"schema": S}}` -> the schema S
#     `json_schema: S` (top level; kept beside a json_object without a schema) -> the schema S
#     `grammar: G` (GBNF, root `root`; "" is no grammar)              -> the grammar G
#   and an absent, null or empty schema `{}` means any object (llama-server sets `{"type": "object"}`).
# - Ollama's `format` follows Ollama's `llamaServerChatResponseFormat`: absent, null or "" is nothing,
#   "json" is JSON mode (`{"type": "json_object"}`), an object is a schema; anything else is refused.
# - Refused, with `SchemaError` and the JSON pointer of the field: a request that is not a JSON object;
#   a malformed field (a non-object response_format, a non-string type or grammar), where
#   llama-server would log a warning and ignore it; two fields that each ask for a constraint (a grammar
#   beside a schema or a response_format, two schemas, Ollama's format beside an OpenAI field), where
#   llama-server refuses one pair and silently drops a field of the others. Reasons llama-server or Ollama
#   have are kept word for word.
# - A refusal of the converter is re-rooted at the schema's place in the request
#   (`#/response_format/json_schema/schema` + the converter's `/properties/a`), and so are the pointers of
#   its report (the keywords the grammar leaves unenforced).
# - `strict` is the caller's: with it, a schema whose grammar leaves a keyword unenforced is refused.
#   OpenAI's own `response_format.json_schema.strict: true` is read and told (`asks_strict`), never acted
#   on here: whether it means this is the server's decision.
# - Nothing else of the request is looked at (messages, tools, sampling options), and a GBNF grammar is
#   passed on as text: compiling it (and refusing it with line and column) is the grammar compiler's job.
from __future__ import annotations

import enum
import functools
import json
from dataclasses import dataclass
from typing import Final

from constraintd.engine.schema.convert import Unenforced, convert_json_schema, report_lines
from constraintd.engine.schema.extended import DEFAULT_DIALECT, check_dialect
from constraintd.engine.schema.json_text import JsonValue, dump_json, parse_json
from constraintd.errors import SchemaError

__all__ = [
    "ANY_JSON_SCHEMA",
    "JSON_OBJECT_SCHEMA",
    "AnswerFormat",
    "RequestGrammar",
    "RequestedConstraint",
    "any_json_grammar",
    "json_object_grammar",
    "read_request",
    "resolve_request",
]

JSON_OBJECT_SCHEMA: Final = '{"type":"object"}'
"""The schema llama-server converts for JSON mode (`response_format: {"type": "json_object"}`)."""
ANY_JSON_SCHEMA: Final = "{}"
"""The schema whose conversion is llama.cpp's grammar of any JSON value."""

# The request fields that ask for a constraint, OpenAI's and Ollama's.
_OPENAI_FIELDS: Final = ("response_format", "json_schema", "grammar")
_OLLAMA_FIELD: Final = "format"


class AnswerFormat(enum.Enum):
    """What a request asks the answer to be."""

    NONE = "none"
    """Free text: no grammar."""
    JSON_OBJECT = "json_object"
    """JSON mode: any JSON object (no schema, or an empty one)."""
    JSON_SCHEMA = "json_schema"
    """A JSON value that the schema describes."""
    GRAMMAR = "grammar"
    """Text that a GBNF grammar describes."""


@dataclass(frozen=True, slots=True)
class RequestedConstraint:
    """What a request asks for, before any conversion.

    Attributes:
        kind: what the answer must be.
        text: the schema as nlohmann's `dump()` prints it (JSON kinds), the GBNF text (GRAMMAR), or None.
        source: the JSON pointer of the request field it comes from; "" when no field asks for anything.
        asks_strict: the request says `response_format.json_schema.strict: true` (OpenAI's structured
            outputs), which this module does not act on.
    """

    kind: AnswerFormat
    text: str | None
    source: str
    asks_strict: bool = False


@dataclass(frozen=True, slots=True)
class RequestGrammar:
    """The grammar a request resolves to: what the answer must be, as GBNF.

    Attributes:
        kind: what the answer must be.
        gbnf: the grammar text, None for `AnswerFormat.NONE`.
        root: the grammar's start symbol.
        warnings: what the schema conversion left unenforced, as lines: llama.cpp's warnings in its
            words, then `pointer: keyword: reason` (`SchemaConversion.report`, pointers in the request).
        source: the JSON pointer of the request field it comes from; "" when no field asks for anything.
        schema: the schema text converted (JSON kinds), else None.
        unenforced: the report itself, its pointers re-rooted in the request.
        asks_strict: as `RequestedConstraint.asks_strict`.
    """

    kind: AnswerFormat
    gbnf: str | None
    root: str = "root"
    warnings: tuple[str, ...] = ()
    source: str = ""
    schema: str | None = None
    unenforced: tuple[Unenforced, ...] = ()
    asks_strict: bool = False


_NO_CONSTRAINT: Final = RequestedConstraint(AnswerFormat.NONE, None, "")


def _field(container: dict[str, JsonValue], name: str) -> JsonValue:
    """nlohmann's `json_value(body, name, default)` before the default: an absent field reads as null."""
    return container.get(name)


def _schema(value: JsonValue, pointer: str, *, asks_strict: bool = False) -> RequestedConstraint:
    """A schema field's value as a constraint: null or `{}` is any object (llama-server's rule)."""
    if value is None or value == {}:
        return RequestedConstraint(AnswerFormat.JSON_OBJECT, JSON_OBJECT_SCHEMA, pointer, asks_strict)
    # A schema that is not an object goes on too: the converter refuses it in llama.cpp's words.
    return RequestedConstraint(AnswerFormat.JSON_SCHEMA, dump_json(value), pointer, asks_strict)


def _response_format_schema(
    response_format: JsonValue, json_schema: JsonValue
) -> tuple[JsonValue, str] | None:
    """The schema `response_format` asks for, with its pointer; None when it asks for none.

    `json_schema` is the top-level field, which a json_object without a schema leaves in force.
    """
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise SchemaError("response_format must be an object", pointer="#/response_format")
    response_type = _field(response_format, "type")
    if response_type is None:
        response_type = ""
    if not isinstance(response_type, str):
        raise SchemaError("response_format type must be a string", pointer="#/response_format/type")
    if response_type in ("", "text"):
        return None
    if response_type == "json_object":
        if "schema" in response_format:
            return _field(response_format, "schema"), "#/response_format/schema"
        if json_schema is None:
            return None, "#/response_format"
        return None  # the top-level json_schema stays in force
    if response_type == "json_schema":
        wrapper = _field(response_format, "json_schema")
        if wrapper is None:
            wrapper = {}
        if not isinstance(wrapper, dict):
            raise SchemaError("response_format json_schema must be an object",
                              pointer="#/response_format/json_schema")
        return _field(wrapper, "schema"), "#/response_format/json_schema/schema"
    raise SchemaError(
        f'response_format type must be one of "text" or "json_object", but got: {response_type}',
        pointer="#/response_format/type",
    )


def _asks_strict(response_format: JsonValue) -> bool:
    """`response_format.json_schema.strict` is `true` (OpenAI's field; llama-server does not read it)."""
    if not isinstance(response_format, dict):
        return False
    wrapper = response_format.get("json_schema")
    return isinstance(wrapper, dict) and wrapper.get("strict") is True


def _read_openai(body: dict[str, JsonValue]) -> RequestedConstraint:
    json_schema = _field(body, "json_schema")
    grammar = _field(body, "grammar")
    if grammar is not None and not isinstance(grammar, str):
        raise SchemaError("grammar must be a string of GBNF", pointer="#/grammar")
    if json_schema is not None and grammar:
        raise SchemaError("Cannot use both json_schema and grammar", pointer="#/grammar")
    from_format = _response_format_schema(_field(body, "response_format"), json_schema)
    if from_format is not None:
        if grammar:
            raise SchemaError("Cannot use both response_format and grammar", pointer="#/grammar")
        if json_schema is not None:
            raise SchemaError("Cannot use both json_schema and a response_format schema",
                              pointer="#/json_schema")
        schema, pointer = from_format
        return _schema(schema, pointer, asks_strict=_asks_strict(_field(body, "response_format")))
    if json_schema is not None:
        return _schema(json_schema, "#/json_schema")
    if grammar:
        return RequestedConstraint(AnswerFormat.GRAMMAR, grammar, "#/grammar")
    return _NO_CONSTRAINT


def _read_ollama(body: dict[str, JsonValue], value: JsonValue) -> RequestedConstraint:
    for name in _OPENAI_FIELDS:
        if _field(body, name) not in (None, ""):
            raise SchemaError(f"Cannot use both format and {name}", pointer=f"#/{name}")
    if value == "json":
        return RequestedConstraint(AnswerFormat.JSON_OBJECT, JSON_OBJECT_SCHEMA, "#/format")
    if isinstance(value, dict):
        return _schema(value, "#/format")
    # Ollama quotes the field's raw JSON text with Go's %q.
    quoted = json.dumps(dump_json(value), ensure_ascii=False)
    raise SchemaError(f'invalid format: {quoted}; expected "json" or a valid JSON Schema object',
                      pointer="#/format")


def read_request(request_text: str) -> RequestedConstraint:
    """Find which constraint an OpenAI or Ollama request body asks for, without converting it.

    Args:
        request_text: the request body, as JSON text.

    Returns:
        The kind of constraint, its schema or grammar text, and the field it comes from.

    Raises:
        SchemaError: the body is not a JSON object, a field is malformed, or two fields conflict; the
            pointer names the field.
    """
    body = parse_json(request_text)
    if not isinstance(body, dict):
        raise SchemaError("a request must be a JSON object", pointer="#")
    ollama_format = _field(body, _OLLAMA_FIELD)
    if ollama_format is not None and ollama_format != "":
        return _read_ollama(body, ollama_format)
    return _read_openai(body)


def _rerooted(pointer: str, source: str) -> str:
    # The converter points into the schema; the caller needs the place in the request.
    # (A pointer that is not a fragment, a remote `$ref`'s text, is left as it is.)
    return source + pointer[1:] if pointer.startswith("#") else pointer


def _converted(requested: RequestedConstraint, *, strict: bool, dialect: str) -> RequestGrammar:
    schema, source = requested.text, requested.source
    assert schema is not None
    try:
        conversion = convert_json_schema(schema, strict=strict, dialect=dialect)
    except SchemaError as exc:
        raise SchemaError(exc.reason, pointer=_rerooted(exc.pointer, source)) from exc
    unenforced = tuple(Unenforced(_rerooted(item.pointer, source), item.keyword, item.reason)
                       for item in conversion.unenforced)
    warnings = report_lines(conversion.warnings, unenforced)
    return RequestGrammar(AnswerFormat.JSON_SCHEMA, conversion.grammar, warnings=warnings, source=source,
                          schema=schema, unenforced=unenforced, asks_strict=requested.asks_strict)


def resolve_request(request_text: str, *, strict: bool = False, dialect: str = DEFAULT_DIALECT,
                    ) -> RequestGrammar:
    """The constraint an OpenAI or Ollama request body asks for, as a GBNF grammar.

    Args:
        request_text: the request body, as JSON text.
        strict: refuse a schema whose grammar would leave a keyword unenforced (see `convert_json_schema`),
            whatever the request says; the request's own `strict` is only told (`asks_strict`).
        dialect: the schema dialect (see `convert_json_schema`): "llama.cpp", or "extended" to enforce
            more of the schema.

    Returns:
        The constraint; its `gbnf` is None when the request asks for free text.

    Raises:
        SchemaError: the request is refused (see `read_request`), or its schema is, by the converter (or by
            `strict`), with the pointer re-rooted at the schema's place in the request.
    """
    check_dialect(dialect)
    requested = read_request(request_text)
    kind, text, source = requested.kind, requested.text, requested.source
    if text is None:
        return RequestGrammar(AnswerFormat.NONE, None)
    if kind is AnswerFormat.GRAMMAR:
        return RequestGrammar(kind, text, source=source)
    if kind is AnswerFormat.JSON_OBJECT:
        # any object: nothing of it is left unenforced, strict or not
        return RequestGrammar(kind, json_object_grammar(), source=source, schema=JSON_OBJECT_SCHEMA,
                              asks_strict=requested.asks_strict)
    return _converted(requested, strict=strict, dialect=dialect)


@functools.cache
def json_object_grammar() -> str:
    """The grammar llama-server uses for JSON mode: the conversion of `{"type": "object"}`."""
    return convert_json_schema(JSON_OBJECT_SCHEMA).grammar


@functools.cache
def any_json_grammar() -> str:
    """llama.cpp's grammar of any JSON value: the conversion of `{}`."""
    return convert_json_schema(ANY_JSON_SCHEMA).grammar
