"""Print the GBNF grammar of a JSON schema, or of the constraint an OpenAI or Ollama request asks for.

    constraintd gbnf --schema schema.json     the grammar llama.cpp's json_schema_to_grammar gives the schema
    constraintd gbnf --request body.json      the grammar a request body asks for: its response_format,
                                              json_schema or grammar (OpenAI, llama-server), or its format
                                              (Ollama)
    --strict                                  refuse a schema whose grammar would leave a keyword unenforced
    --dialect extended                        enforce more than llama.cpp where a grammar can (string
                                              formats, integer bounds); the report names only the rest

FILE may be `-` for standard input. The grammar goes to standard output; the report of the conversion goes
to standard error, one line per keyword the grammar does not enforce: `pointer: keyword: reason` (the
pointer into the request for --request). A request that asks for no constraint prints nothing.
Exit status: 0 with the grammar printed; 1 when the file cannot be read; 2 when the schema or request is
refused (the reason and the JSON pointer of the offending node, or with --strict of the first unenforced
keyword, go to standard error), and for a usage error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from constraintd.engine.chat.requests import AnswerFormat, resolve_request
from constraintd.engine.schema.convert import Unenforced, convert_json_schema
from constraintd.engine.schema.extended import DEFAULT_DIALECT, DIALECTS
from constraintd.errors import InputError

PROG = "constraintd gbnf"
REFUSED = 2
UNREADABLE = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--schema", metavar="FILE", help="a JSON schema (`-`: standard input)")
    source.add_argument("--request", metavar="FILE",
                        help="an OpenAI or Ollama request body (`-`: standard input)")
    parser.add_argument("--strict", action="store_true",
                        help="refuse a schema whose grammar would not enforce one of its keywords")
    parser.add_argument("--dialect", choices=DIALECTS, default=DEFAULT_DIALECT,
                        help="the schema dialect: llama.cpp's grammar (the default), or extended: "
                             "enforce more of the schema")


def _read(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    return Path(name).read_text(encoding="utf-8")


def _grammar(args: argparse.Namespace) -> tuple[str | None, tuple[Unenforced, ...]]:
    """The grammar to print (None: the request asks for none) and the report of its conversion."""
    if args.schema is not None:
        conversion = convert_json_schema(_read(args.schema), strict=args.strict, dialect=args.dialect)
        return conversion.grammar, conversion.unenforced
    constraint = resolve_request(_read(args.request), strict=args.strict, dialect=args.dialect)
    if constraint.kind is AnswerFormat.NONE:
        return None, ()
    return constraint.gbnf, constraint.unenforced


def run(args: argparse.Namespace) -> int:
    try:
        grammar, report = _grammar(args)
    except InputError as exc:
        print(f"{PROG}: refused: {exc}", file=sys.stderr)
        return REFUSED
    except (OSError, UnicodeDecodeError) as exc:
        print(f"{PROG}: cannot read the input: {exc}", file=sys.stderr)
        return UNREADABLE
    for item in report:
        print(item, file=sys.stderr)
    if grammar is None:
        print(f"{PROG}: the request asks for no constraint", file=sys.stderr)
        return 0
    sys.stdout.write(grammar if grammar.endswith("\n") else grammar + "\n")
    return 0
