"""Print the GBNF grammar of a JSON schema, or of the constraint an OpenAI or Ollama request asks for.

    constraintd gbnf --schema schema.json     the grammar llama.cpp's json_schema_to_grammar gives the schema
    constraintd gbnf --request body.json      the grammar a request body asks for: its response_format,
                                              json_schema or grammar (OpenAI, llama-server), or its format
                                              (Ollama)

FILE may be `-` for standard input. The grammar goes to standard output, the conversion's warnings (what
the grammar leaves unenforced) to standard error. A request that asks for no constraint prints nothing.
Exit status: 0 with the grammar printed; 1 when the schema or request is refused (the reason and the JSON
pointer of the offending node go to standard error) or the file cannot be read; 2 for a usage error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from constraintd.engine.chat.requests import AnswerFormat, resolve_request
from constraintd.engine.schema.convert import convert_json_schema
from constraintd.errors import InputError

PROG = "constraintd gbnf"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--schema", metavar="FILE", help="a JSON schema (`-`: standard input)")
    source.add_argument("--request", metavar="FILE",
                        help="an OpenAI or Ollama request body (`-`: standard input)")


def _read(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    return Path(name).read_text(encoding="utf-8")


def _grammar(args: argparse.Namespace) -> tuple[str | None, tuple[str, ...]]:
    """The grammar to print (None: the request asks for none) and the warnings of its conversion."""
    if args.schema is not None:
        conversion = convert_json_schema(_read(args.schema))
        return conversion.grammar, tuple(conversion.warnings)
    constraint = resolve_request(_read(args.request))
    if constraint.kind is AnswerFormat.NONE:
        return None, ()
    return constraint.gbnf, constraint.warnings


def run(args: argparse.Namespace) -> int:
    try:
        grammar, warnings = _grammar(args)
    except InputError as exc:
        print(f"{PROG}: refused: {exc}", file=sys.stderr)
        return 1
    except (OSError, UnicodeDecodeError) as exc:
        print(f"{PROG}: cannot read the input: {exc}", file=sys.stderr)
        return 1
    for warning in warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    if grammar is None:
        print(f"{PROG}: the request asks for no constraint", file=sys.stderr)
        return 0
    sys.stdout.write(grammar if grammar.endswith("\n") else grammar + "\n")
    return 0
