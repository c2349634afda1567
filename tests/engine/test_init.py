"""The engine's public API is explicit: `constraintd.engine.__all__` is exactly this list."""

from __future__ import annotations

import constraintd.engine

PUBLIC = [
    "Grammar",
    "GrammarError",
    "GreType",
    "LimitError",
    "Matcher",
    "ParsedGrammar",
    "TokenError",
    "Vocab",
    "VocabError",
    "allowed_tokens",
    "apply_mask",
    "check_grammar",
    "mask_words",
    "pack_mask",
    "parse_gbnf",
    "unpack_mask",
]


def test_public_names() -> None:
    assert sorted(constraintd.engine.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(constraintd.engine, name) is not None
