"""Hypothesis strategies for small random grammars, texts and vocabularies (engine property tests).

The grammars use a tiny alphabet so that random texts often match: ASCII letters a-c, "é" (2 bytes),
"中" (3 bytes) and "😀" (4 bytes), so partial UTF-8 sequences across tokens are common. Left-recursive
draws are for the caller to skip (they raise GrammarError when compiled). Token terminals name
tokens 1 and 2.
"""

from __future__ import annotations

from hypothesis import assume
from hypothesis import strategies as st

from constraintd.engine.grammar.compiled import Grammar
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import GrammarError

ALPHABET = "abcé中😀"
RULES = ("root", "r1", "r2", "r3")

_ATOMS = st.sampled_from(
    [
        '"a"',
        '"b"',
        '"ab"',
        '"é"',
        '"中"',
        '"a😀"',
        "[a-c]",
        "[^a]",
        "[^é中]",
        "[é-中]",
        ".",
        "[a-b😀]",
        "r1",
        "r2",
        "r3",
        '("a" | "b" r2)',
        '("" | "c")',
        "<[1]>",
        "!<[2]>",
    ]
)
_QUANTIFIERS = st.sampled_from(["", "", "", "*", "+", "?", "{2}", "{0,2}", "{1,}"])


@st.composite
def grammars(draw: st.DrawFn) -> str:
    """A GBNF text with rules root, r1, r2, r3 (possibly left-recursive)."""
    lines = []
    for name in RULES:
        alternates = []
        for _ in range(draw(st.integers(1, 3))):
            items = [draw(_ATOMS) + draw(_QUANTIFIERS) for _ in range(draw(st.integers(0, 3)))]
            alternates.append(" ".join(items) or '""')
        lines.append(f"{name} ::= " + " | ".join(alternates))
    return "\n".join(lines) + "\n"


def texts(max_size: int = 6) -> st.SearchStrategy[str]:
    return st.text(alphabet=ALPHABET, max_size=max_size)


_PIECES = st.one_of(
    st.text(alphabet=ALPHABET, min_size=1, max_size=3).map(lambda t: t.encode()),
    st.sampled_from(
        [
            b"\xc3",
            b"\xa9",
            b"\xe4",
            b"\xb8",
            b"\xad",
            b"\xe4\xb8",
            b"\xb8\xad",
            b"\xf0\x9f",
            b"\x98\x80",
            b"\x9f\x98",
            b"a\xc3",
            b"\xa9b",
            b"\x80",
            b"\xff",
            b"",
            b"\x00a",
            b"a\x00b",
        ]
    ),
)


@st.composite
def vocabs(draw: st.DrawFn) -> Vocab:
    """A small vocabulary: every single alphabet byte sequence's bytes, plus random pieces, one EOG token."""
    base = sorted({bytes((b,)) for ch in ALPHABET for b in ch.encode()})
    extra = draw(st.lists(_PIECES, max_size=12))
    pieces = [b"</s>", *base, *extra]
    return Vocab(pieces, eog_ids=[0])


def compile_or_skip(text: str, vocab: Vocab) -> Grammar:
    """The grammar of a drawn text over a drawn vocabulary; an example whose grammar is refused is skipped."""
    try:
        return Grammar.from_gbnf(text, vocab)
    except GrammarError:
        assume(False)
        raise
