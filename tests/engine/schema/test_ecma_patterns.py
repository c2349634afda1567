"""Patterns in the extended dialect (constraintd/engine/schema/ecma_patterns.py): the grammar of a string
`pattern` takes a JSON string exactly when the pattern matches its value, as ECMA-262 reads the pattern.

The reference is Python's `re.search` over the decoded value, made to read as ECMA-262 does where the two
differ on these tests: ASCII `\\d \\w` (re.ASCII), `$` only at the very end (`\\Z`), `\\u{...}` as
`\\U...`, and texts without the characters on which `.` and `\\s` differ (\\r, U+2028, U+2029, Unicode
spaces).
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Final

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.schema.convert import convert_json_schema
from constraintd.engine.schema.ecma_patterns import Unsupported, pattern_rule

BYTES: Final = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])
ALPHABET: Final = 'ab1_ é"\\\n\t\x7f/'


def spelled(value: str) -> bytes:
    """JSON's own spelling of a string, DEL escaped (llama.cpp's strings never take it raw)."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f").encode()


def grammar_of(pattern: str) -> Grammar:
    conversion = convert_json_schema(json.dumps({"type": "string", "pattern": pattern}), dialect="extended",
                                     strict=True)
    return Grammar.from_gbnf(conversion.grammar, BYTES)


def takes(grammar: Grammar, data: bytes) -> bool:
    matcher = Matcher(grammar)
    return matcher.accept_bytes(data) and matcher.is_complete()


def ecma_search(pattern: str, value: str) -> bool:
    python = re.sub(r"(?<!\\)\$", r"\\Z", pattern)
    python = re.sub(r"\\u\{([0-9a-fA-F]+)\}", lambda match: f"\\U{int(match[1], 16):08x}", python)
    return re.search(python, value, re.ASCII) is not None


PATTERNS: Final = [
    "^a$", "a", "^a", "a$", "", "^$", "^[ab]+$", "^[^ab]*$", "b.a", "^.$", "^\\d{2,3}$", "^\\w+$", "\\s",
    "^\\S*$", "^(a|b1)*$", "^a|b$", "^(?:ab)?_$", "^[\\d_]{1,2}$", '^"', "\\\\", "^[\\x00-\\x1f]$",
    "^[^\\n]+$", "^a{2}$", "^é+$", "^\\D\\W$", "^[a-b1]{0,}?$", "^\\/$", "^[-a]$", "^\\t\\n$", "a+?b",
    "^(a|)b$", "^\\u00e9$", "^\\u{e9}$", "^\\x41?a$",
    # unbounded repetitions of what may be empty: the repetition of the non-empty strings
    "(a*)*", "^(a|)+$", "^(a?b?)*$", "^(a*1?)*_$", "^(?:\\/?[ab]*)*$", "^(a?){2,}b$",
    "^(https?:\\/\\/)?([\\da-z\\.-]+)\\.([a-z\\.]{2,6})([\\/\\w \\.-]*)*\\/?$",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_short_strings_are_taken_as_ecma_matches_them(pattern: str) -> None:
    grammar = grammar_of(pattern)
    for length in range(4):
        for chars in itertools.product(ALPHABET, repeat=length):
            value = "".join(chars)
            assert takes(grammar, spelled(value)) == ecma_search(pattern, value), (pattern, value)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(PATTERNS), st.text(ALPHABET + "AZ09:-", max_size=12))
def test_random_strings(pattern: str, value: str) -> None:
    assert takes(grammar_of(pattern), spelled(value)) == ecma_search(pattern, value), (pattern, value)


def test_escaped_spellings() -> None:
    grammar = grammar_of('^"\\n$')
    assert takes(grammar, b'"\\"\\n"')
    assert takes(grammar, b'"\\u0022\\u000A"')
    assert not takes(grammar, b'"""')  # no JSON
    assert not takes(grammar_of("^a$"), b'"\\u0061"')  # a valid spelling refused, never an invalid one taken
    # text around an unanchored pattern: any JSON string text
    assert takes(grammar_of("a"), b'"\\u0062a\\/"')
    assert not takes(grammar_of("a"), b'"\\"')


def test_ecma_dot_leaves_out_line_terminators() -> None:
    grammar = grammar_of("^.$")
    for value in ("\n", "\r", "\u2028", "\u2029"):
        assert not takes(grammar, spelled(value))
    assert takes(grammar, spelled("\u2027"))
    assert takes(grammar_of("^\\s$"), spelled("\u3000"))  # ECMA's white space is Unicode's


@pytest.mark.parametrize("pattern", [
    "(?=a)", "(?<n>a)", "(a)\\1", "\\bword", "\\p{L}", "a(^b)", "a{", "(^a|b)*", "[]", "[z-a]",
    "\\ud800", "a{2000}", "(a", "a)", "*a", "\\q",
], ids=str)
def test_what_it_does_not_read_is_left_to_llama_cpp(pattern: str) -> None:
    with pytest.raises(Unsupported):
        pattern_rule(pattern, "x-any-char")


def test_a_pattern_it_does_not_read_stays_reported() -> None:
    schema = json.dumps({"type": "string", "pattern": "^(?=a)b$"})
    conversion = convert_json_schema(schema, dialect="extended")
    assert [item.keyword for item in conversion.unenforced] == ["pattern"]
    assert conversion.grammar == convert_json_schema(schema).grammar




def test_a_counted_repetition_of_groups_compiles() -> None:
    # GBNF bounds the groups a counted repetition copies: the repeated groups become one rule
    grammar = grammar_of("^(?:\\S+\\s+){0,199}\\S+$")
    assert takes(grammar, spelled("a b\tc"))
    assert not takes(grammar, spelled("a b "))


LENGTHS: Final = [
    ("^[a-z][a-z0-9-]*$", 1, 5), ("^a+$", 2, 3), ("^(?:ab)?[0-9]{2}$", 2, 4), ("^x\\d*y$", 0, 3),
    ("a", 1, None),
    ("^[ab]{2,6}$", 3, None), ("^.*$", 0, 2), ("^[ab]{0,4}$", 0, 9),
]


@pytest.mark.parametrize(("pattern", "min_length", "max_length"), LENGTHS, ids=str)
def test_lengths_beside_a_pattern(pattern: str, min_length: int, max_length: int | None) -> None:
    schema = {"type": "string", "pattern": pattern, "minLength": min_length}
    if max_length is not None:
        schema["maxLength"] = max_length
    conversion = convert_json_schema(json.dumps(schema), dialect="extended", strict=True)
    grammar = Grammar.from_gbnf(conversion.grammar, BYTES)
    for length in range(7):
        for chars in itertools.product("ab0-xy", repeat=length):
            value = "".join(chars)
            expected = ecma_search(pattern, value) and min_length <= len(value) <= (max_length or 99)
            assert takes(grammar, spelled(value)) == expected, (pattern, value)


@pytest.mark.parametrize(("pattern", "min_length", "max_length"), [
    ("^(a|bb)+$", 2, 3), ("a", 0, 3), ("^a*b*$", 0, 2), ("^a{2}$", 3, 4),
], ids=str)
def test_lengths_it_cannot_intersect_stay_reported(pattern: str, min_length: int, max_length: int) -> None:
    schema = {"type": "string", "pattern": pattern, "minLength": min_length, "maxLength": max_length}
    conversion = convert_json_schema(json.dumps(schema), dialect="extended")
    assert {item.keyword for item in conversion.unenforced} <= {"minLength", "maxLength"}
    assert conversion.unenforced
