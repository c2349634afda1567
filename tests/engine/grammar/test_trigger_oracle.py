"""Trigger patterns against llama.cpp's own search (std::regex, built from the reference source): drawn
patterns of the ECMAScript subset the automaton reads, on drawn texts, find the same replay start."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constraintd.engine import GrammarError
from constraintd.engine.grammar.triggers import TriggerPattern
from tests.conftest import OracleReport
from tests.trigger_oracle.build import harness_binary, llama_find

pytestmark = pytest.mark.oracle

TEXT_BYTES = b"abxy .\n_1{"
QUANTIFIERS = ["*", "+", "?", "*?", "+?", "??", "{2}", "{1,2}", "{0,2}", "{2,}", "{1,2}?"]


@dataclass(frozen=True)
class Piece:
    """A drawn piece of a pattern, and whether it can match the empty text."""

    text: str
    nullable: bool


@st.composite
def atoms(draw: st.DrawFn) -> Piece:
    text = draw(
        st.sampled_from(
            ["a", "b", "x", "y", " ", "\\.", "\\n", "[ab]", "[^a]", "[a-x]", "[^\\n]", ".", "\\d", "\\w",
             "\\s", "\\S", "\\W", "\\{", "[\\s\\S]", "(?:ab)"]
        )
    )
    return Piece(text, False)


@st.composite
def pieces(draw: st.DrawFn, depth: int = 0) -> Piece:
    kind = draw(st.integers(0, 9 if depth < 2 else 5))
    if kind <= 4:
        piece = draw(atoms())
    elif kind == 5:
        return Piece(draw(st.sampled_from(["\\b", "\\B", "(?=a)", "(?!b)", "(?=x|y)"])), True)
    elif kind <= 7:
        inner = draw(sequences(depth + 1))
        piece = Piece(f"({inner.text})", inner.nullable)
    else:
        left, right = draw(sequences(depth + 1)), draw(sequences(depth + 1))
        capture = draw(st.booleans())
        piece = Piece(f"({'' if capture else '?:'}{left.text}|{right.text})", left.nullable or right.nullable)
    # a loop over a body that can match empty is where the automaton's priorities may differ from
    # backtracking's (trigger_regex.py says so); drawn patterns quantify only bodies that cannot
    if not piece.nullable and draw(st.booleans()):
        quantifier = draw(st.sampled_from(QUANTIFIERS))
        nullable = quantifier[0] in "*?" or quantifier.startswith("{0")
        return Piece(piece.text + quantifier, nullable)
    return piece


@st.composite
def sequences(draw: st.DrawFn, depth: int = 0) -> Piece:
    parts = draw(st.lists(pieces(depth), min_size=1, max_size=3))
    return Piece("".join(p.text for p in parts), all(p.nullable for p in parts))


@st.composite
def patterns(draw: st.DrawFn) -> str:
    body = draw(sequences()).text
    anchors = draw(st.sampled_from(["", "^", "$", "^$"]))
    return ("^" if "^" in anchors else "") + body + ("$" if "$" in anchors else "")


@pytest.fixture(scope="module")
def oracle(llama_cpp_dir: Path) -> Path:
    return harness_binary(llama_cpp_dir)


def texts_for(pattern: str, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    literal = [c.encode() for c in pattern if c.isalnum() or c in " ._{"]
    alphabet = [bytes((b,)) for b in TEXT_BYTES] + literal
    return [b"".join(rng.choice(alphabet) for _ in range(rng.randrange(12))) for _ in range(40)]


@settings(max_examples=300)
@given(patterns(), st.integers(0, 2**32))
def test_drawn_patterns_find_what_llama_cpp_finds(
    oracle: Path, oracle_report: OracleReport, pattern: str, seed: int
) -> None:
    texts = texts_for(pattern, seed)
    (expected,) = llama_find(oracle, [(pattern.encode(), texts)])
    assert expected != "refused", f"std::regex refuses {pattern!r}, which the automaton reads"
    try:
        compiled = TriggerPattern.compile(pattern)
    except GrammarError as error:
        raise AssertionError(f"{pattern!r} is refused, and llama.cpp reads it: {error}") from error
    found = [compiled.find(text) for text in texts]
    assert isinstance(expected, list)
    rows = zip(texts, found, expected, strict=True)
    compared = [(text, ours, theirs) for text, ours, theirs in rows if theirs != -2]
    same = sum(ours == theirs for _, ours, theirs in compared)
    oracle_report.add("trigger pattern finds", "drawn", identical=same, total=len(compared))
    assert [(t, o) for t, o, _ in compared] == [(t, e) for t, _, e in compared], pattern
