"""Patterns whose grammar takes, inside a string's JSON text, a character JSON writes only as an escape
(constraintd/engine/schema/raw_text.py)."""

from __future__ import annotations

import json

import pytest

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.schema.convert import convert_json_schema
from constraintd.engine.schema.raw_text import matches_unescaped

BYTES = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])

# (pattern, may it match a quote, backslash or control character, a JSON text its grammar takes that is no
# JSON string of the pattern, or None)
PATTERNS = [
    ("^(.*)$", True, '"a"b"'),
    ("^[^a]+$", True, '"\\"'),
    ('^a"b$', True, '"a"b"'),
    ("^[ -~]+$", True, '"\\"'),
    ("^a\\nb$", True, '"a\nb"'),
    ("^\\\\$", True, '"\\"'),
    ("^\\x22$", True, '"""'),
    ("^[\\x00-\\x1f]$", True, '"\x01"'),
    ("^\\U00000022$", True, None),
    ("^#[0-9a-f]{6}$", False, None),
    ("^[a-z\\-]+$", False, None),
    ("^[a-z.]+$", False, None),
    ("^\\.$", False, None),
    ("^(rtmp|hls)$", False, None),
    ("^[A-Z]{2}-[0-9]{1,3}$", False, None),
    ("^é+$", False, None),
]


@pytest.mark.parametrize(("pattern", "expected", "text"), PATTERNS, ids=[p for p, _, _ in PATTERNS])
def test_matches_unescaped(pattern: str, expected: bool, text: str | None) -> None:
    assert matches_unescaped(pattern) is expected
    if text is not None:  # the hazard, shown: the grammar takes text that is not that JSON string
        gbnf = convert_json_schema(json.dumps({"type": "string", "pattern": pattern})).grammar
        matcher = Matcher(Grammar.from_gbnf(gbnf, BYTES))
        assert matcher.accept_bytes(text.encode()) and matcher.is_complete()
