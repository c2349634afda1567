"""llama.cpp's grammar integration vectors, read from its C++ test source (never retyped).

`tests/test-grammar-integration.cpp` calls `test_grammar(desc, grammar, passing, failing)` and
`test_schema(desc, schema, passing, failing)`; each string is C++ string literals and `token(N)` calls
joined with `+`. `read_integration_cases` returns them as `GrammarCase`s, a string being a tuple of parts:
`str` text or `int` token id. The harness there (`match_string`) feeds text one code point at a time as
token 0 with that code point's UTF-8 as its piece, and a token N with the piece "<[N]>".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

Part = str | int


@dataclass(frozen=True)
class GrammarCase:
    kind: str  # "grammar" or "schema"
    description: str
    text: str  # the GBNF grammar or the JSON schema
    passing: tuple[tuple[Part, ...], ...]
    failing: tuple[tuple[Part, ...], ...]


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
_TOKEN_CALL = re.compile(r"token\((\d+)\)")
_RAW_OPEN = re.compile(r'R"([^(\s]*)\(')


class _Reader:
    def __init__(self, text: str, pos: int) -> None:
        self.text = text
        self.pos = pos

    def skip(self) -> None:
        while True:
            while self.pos < len(self.text) and self.text[self.pos].isspace():
                self.pos += 1
            if self.text.startswith("//", self.pos):
                self.pos = self.text.index("\n", self.pos)
            else:
                return

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos]

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise ValueError(f"expected {char!r} at {self.text[self.pos : self.pos + 40]!r}")
        self.pos += 1

    def literal(self) -> str | None:
        self.skip()
        raw = _RAW_OPEN.match(self.text, self.pos)
        if raw:
            end = self.text.index(f'){raw.group(1)}"', raw.end())
            self.pos = end + len(raw.group(1)) + 2
            return self.text[raw.end() : end]
        if self.text[self.pos] != '"':
            return None
        out: list[str] = []
        pos = self.pos + 1
        while self.text[pos] != '"':
            if self.text[pos] == "\\":
                out.append(_ESCAPES[self.text[pos + 1]])
                pos += 2
            else:
                out.append(self.text[pos])
                pos += 1
        self.pos = pos + 1
        return "".join(out)

    def string(self) -> tuple[Part, ...]:
        # a sum of literals (adjacent ones concatenate) and token(N) calls
        parts: list[Part] = []
        while True:
            self.skip()
            call = _TOKEN_CALL.match(self.text, self.pos)
            if call:
                parts.append(int(call.group(1)))
                self.pos = call.end()
            else:
                text = self.literal()
                if text is None:
                    raise ValueError(f"unexpected {self.text[self.pos : self.pos + 40]!r}")
                while (more := self.literal()) is not None:
                    text += more
                parts.append(text)
            if self.peek() != "+":
                merged: list[Part] = []
                for part in parts:
                    if merged and isinstance(part, str) and isinstance(merged[-1], str):
                        merged[-1] += part
                    elif part != "":
                        merged.append(part)
                return tuple(merged) or ("",)
            self.pos += 1

    def strings(self) -> tuple[tuple[Part, ...], ...]:
        self.expect("{")
        found: list[tuple[Part, ...]] = []
        while self.peek() != "}":
            found.append(self.string())
            if self.peek() == ",":
                self.pos += 1
        self.pos += 1
        return tuple(found)


def read_integration_cases(llama_cpp_dir: Path) -> list[GrammarCase]:
    source = (llama_cpp_dir / "tests" / "test-grammar-integration.cpp").read_text()
    cases: list[GrammarCase] = []
    for call in re.finditer(r"\n\s*test_(grammar|schema)\(", source):
        reader = _Reader(source, call.end())
        description = reader.string()
        reader.expect(",")
        text = reader.string()
        reader.expect(",")
        passing = reader.strings()
        reader.expect(",")
        failing = reader.strings()
        reader.expect(")")
        assert len(description) == 1 and isinstance(description[0], str)
        assert len(text) == 1 and isinstance(text[0], str)
        cases.append(GrammarCase(call.group(1), description[0], text[0], passing, failing))
    return cases
