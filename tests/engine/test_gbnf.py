"""The GBNF parser against llama.cpp: its own test vectors (read from its source tree), its grammars,
the refusals it makes, and llama.cpp itself deciding the same texts (oracle)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from constraintd.engine.gbnf import (
    GreType,
    parse_gbnf,
)
from constraintd.errors import GrammarError
from tests import reference

# --- llama.cpp's C++ test sources, read at test time ------------------------------------------------------

_RAW = r'R"""\((.*?)\)"""'  # the raw string literals llama.cpp's grammar tests write grammars in
_ELEMENT = r"\{LLAMA_GRETYPE_(\w+),\s*('(?:\\.|[^'])'|\d+)\s*\}"  # {LLAMA_GRETYPE_CHAR, 'a'}
_C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", "'": "'", '"': '"'}


@dataclass(frozen=True)
class ParserVector:
    """One `verify_parsing` call of tests/test-grammar-parser.cpp."""

    grammar: str
    symbol_ids: dict[str, int]
    elements: list[tuple[int, int]]


def _c_value(literal: str) -> int:
    # A C char literal ('a', '\n') or an unsigned integer, as the vectors write element values.
    if literal.startswith("'"):
        body = literal[1:-1]
        return ord(_C_ESCAPES[body[1]] if body.startswith("\\") else body)
    return int(literal)


def _source(name: str) -> str:
    return reference.require(reference.llama_cpp_dir() / "tests" / name).read_text(encoding="utf-8")


def parser_vectors() -> tuple[list[ParserVector], list[str]]:
    """The `verify_parsing` and `verify_failure` cases of tests/test-grammar-parser.cpp."""
    source = _source("test-grammar-parser.cpp")
    source = source[source.index("int main") :]
    parsing = []
    symbols_block = r"\{((?:\s*\{[^{}]*\},?)*\s*)\}"  # {{"root", 0}, {"root_1", 1}, ...}
    call_pattern = r"verify_parsing\(" + _RAW + r",\s*" + symbols_block + r",\s*\{(.*?)\}\);"
    for call in re.finditer(call_pattern, source, re.S):
        grammar, symbols, elements = call.groups()
        symbols = re.sub(r"//[^\n]*", "", symbols)
        elements = re.sub(r"//[^\n]*|/\*.*?\*/", "", elements)
        parsing.append(
            ParserVector(
                grammar=grammar,
                symbol_ids={name: int(i) for name, i in re.findall(r'\{"([^"]*)",\s*(\d+)\}', symbols)},
                elements=[
                    (GreType[kind], _c_value(value.strip())) for kind, value in re.findall(_ELEMENT, elements)
                ],
            )
        )
    failures = re.findall(r"verify_failure\(" + _RAW + r"\);", source, re.S)
    assert len(parsing) == source.count("verify_parsing(")
    assert len(failures) == source.count("verify_failure(")
    return parsing, failures


PARSING, FAILURES = parser_vectors()


def test_read_llama_cpp_parser_vectors() -> None:
    # 20 `verify_parsing` and 6 `verify_failure` calls in the pinned llama.cpp
    assert len(PARSING) > 0 and len(FAILURES) > 0
    assert all(vector.elements and vector.symbol_ids for vector in PARSING)


@pytest.mark.parametrize("vector", PARSING, ids=[f"parsing{i}" for i in range(len(PARSING))])
def test_llama_cpp_parsing_vectors(vector: ParserVector) -> None:
    parsed = parse_gbnf(vector.grammar)
    assert dict(parsed.symbol_ids) == vector.symbol_ids
    assert [element for rule in parsed.rules for element in rule] == vector.elements


@pytest.mark.parametrize("grammar", FAILURES, ids=[f"failure{i}" for i in range(len(FAILURES))])
def test_llama_cpp_failure_vectors(grammar: str) -> None:
    with pytest.raises(GrammarError):
        parse_gbnf(grammar)
