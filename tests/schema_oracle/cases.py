"""llama.cpp's own JSON-schema test cases, read from `tests/test-json-schema-to-grammar.cpp` of the reference.

Each `test({ STATUS, "name", <schema raw string>, <grammar raw string> });` initializer of its `test_all`
becomes a `LlamaCase`. They are compared as that test compares them: `trim` strips surrounding whitespace
and the indentation at the start of every line, on both sides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TEST_FILE = "tests/test-json-schema-to-grammar.cpp"
# One C++ string literal: a raw string R"delim(...)delim" or a plain "..." (escapes decoded below).
_LITERAL = re.compile(
    r'R"(?P<delim>[^(\s]*)\((?P<raw>.*?)\)(?P=delim)"|"(?P<plain>(?:[^"\\\n]|\\.)*)"', re.DOTALL
)
_CASE_START = re.compile(r"\btest\(\{\s*(?P<status>SUCCESS|FAILURE)\s*,")
_C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'", "0": "\0"}


@dataclass(frozen=True, slots=True)
class LlamaCase:
    name: str
    success: bool
    schema: str
    grammar: str  # "" for an expected failure


def c_string(body: str) -> str:
    """The value of a plain C++ string literal's body (simple escapes only: \\n, \\", \\\\, ...)."""
    return re.sub(r"\\(.)", lambda m: _C_ESCAPES.get(m.group(1), m.group(1)), body)


def _literal_text(match: re.Match[str]) -> str:
    if match.group("raw") is not None:
        return match.group("raw")
    return c_string(match.group("plain"))


def read_cases(llama_cpp_dir: Path) -> list[LlamaCase]:
    """Every `test({...})` case of the reference's JSON-schema test, in file order."""
    source = (llama_cpp_dir / TEST_FILE).read_text()
    cases = []
    for start in _CASE_START.finditer(source):
        pos = start.end()
        texts = []
        for _ in range(3):
            literal = _LITERAL.search(source, pos)
            if literal is None:
                raise ValueError(f"{TEST_FILE}: incomplete test case at offset {start.start()}")
            if source[pos : literal.start()].strip(" \n\t,") != "":
                raise ValueError(f"{TEST_FILE}: unexpected text before offset {literal.start()}")
            texts.append(_literal_text(literal))
            pos = literal.end()
        name, schema, grammar = texts
        cases.append(LlamaCase(name, start.group("status") == "SUCCESS", schema, grammar))
    return cases


def trim(text: str) -> str:
    """The C++ test's `trim`: strip " \\n\\r\\t" around, then the spaces and tabs that start each line."""
    return re.sub(r"(^|\n)[ \t]+", r"\1", text.strip(" \n\r\t"))
