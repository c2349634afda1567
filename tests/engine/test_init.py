"""The engine's public API is explicit: `constraintd.engine.__all__` is exactly this list."""

from __future__ import annotations

import constraintd.engine

PUBLIC = [
    "AnswerFormat",
    "ConstraintdError",
    "ContentStream",
    "Grammar",
    "GrammarError",
    "GreType",
    "InputError",
    "LimitError",
    "Matcher",
    "ParsedGrammar",
    "RequestGrammar",
    "SchemaConversion",
    "SchemaError",
    "TokenError",
    "Vocab",
    "VocabError",
    "allocate_masks",
    "allowed_tokens",
    "apply_mask",
    "check_grammar",
    "convert_json_schema",
    "json_content",
    "json_message",
    "json_object_grammar",
    "json_schema_to_gbnf",
    "mask_words",
    "pack_mask",
    "parse_gbnf",
    "resolve_request",
    "unpack_mask",
]


def test_public_names() -> None:
    assert sorted(constraintd.engine.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(constraintd.engine, name) is not None
