"""The `constraintd` command: argument parsing only.

Each subcommand is a module of `constraintd.commands` that defines `add_arguments(parser)` and
`run(args) -> int`; its docstring's first line is its help. Exit codes are the subcommand's; 2 is a usage
error (argparse's own).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

import constraintd.commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="constraintd",
        description="Grammar-constrained decoding as a service: llama.cpp's GBNF engine and JSON-schema "
        "converter, checked against llama.cpp, served over gRPC.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(constraintd.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"constraintd.commands.{info.name}")
        doc = module.__doc__ or info.name
        command = sub.add_parser(info.name, help=doc.strip().splitlines()[0], description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
