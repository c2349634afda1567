"""Patterns as GBNF: llama.cpp's translator, its messages, its byte-wise walk; oracle on generated ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constraintd.engine.schema.patterns import (
    MAX_PATTERN_DEPTH,
    InvalidPattern,
    UnsupportedPattern,
    gbnf_escape_length,
    pattern_to_rule,
)
from tests.conftest import OracleReport
from tests.schema_oracle.build import harness_binary
from tests.schema_oracle.compare import compare_conversion
from tests.schema_oracle.strategies import patterns


@pytest.fixture(scope="session")
def schema_oracle(llama_cpp_dir: Path) -> Path:
    return harness_binary(llama_cpp_dir)


class Rules:
    """A stand-in for the converter's add_rule: records calls, renames a changed rule as llama.cpp does."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []

    def add(self, name: str, rule: str) -> str:
        self.calls.append((name, rule))
        key, i = name, 0
        while key in self.rules and self.rules[key] != rule:
            key, i = f"{name}{i}", i + 1
        self.rules[key] = rule
        return key


@pytest.mark.parametrize(
    ("text", "length"),
    [("\\n", 2), ("\\-", 2), ("\\x41", 4), ("\\x4", 0), ("\\u00e9", 6), ("\\U0001F600", 10), ("\\xZZ", 0),
     ("\\d", 0), ("\\", 0), ("a", 0)],
    ids=["newline", "hyphen", "hex2", "short-hex", "hex4", "hex8", "bad-hex", "shorthand", "alone", "plain"],
)
def test_gbnf_escape_length(text: str, length: int) -> None:
    assert gbnf_escape_length(text, 0) == length


@pytest.mark.parametrize(
    ("pattern", "rules"),
    [
        ("^abc$", {"p": '"\\"" ("abc") "\\""'}),
        ("^ab*$", {"p": '"\\"" ("a" "b"*) "\\""'}),
        ("^a.b$", {"dot": "[^\\x0A\\x0D]", "p": '"\\"" ("a" dot "b") "\\""'}),
        ("^[a-z]{2}x{1,3}[a-z]{4}$", {"p-1": "[a-z]", "p": '"\\"" (p-1{2,2} "x"{1,3} p-1{4,4}) "\\""'}),
        ("^(?:ab|c)+$", {"p": '"\\"" (("ab" | "c")+) "\\""'}),
    ],
    ids=["literal", "quantifier-splits-literal", "dot", "shared-sub-rule", "group"],
)
def test_translation(pattern: str, rules: dict[str, str]) -> None:
    table = Rules()
    assert pattern_to_rule(pattern, "p", table.add) == "p"
    assert table.rules == rules


@pytest.mark.parametrize(
    ("pattern", "error", "message"),
    [
        ("abc", UnsupportedPattern, "not anchored with '^' and '$'"),
        ("^(?=a)$", UnsupportedPattern, "unsupported group syntax"),
        ("^a^b$", UnsupportedPattern, "anchor inside the pattern"),
        ("^\\w$", UnsupportedPattern, "unsupported escape: \\w"),
        ("^[\\d]$", UnsupportedPattern, "unsupported escape in character class: \\d"),
        ("^a{1,2,3}$", UnsupportedPattern, "wrong number of values in curly brackets"),
        ("^a{x}$", UnsupportedPattern, "invalid number in curly brackets"),
        ("^a{2$", UnsupportedPattern, "unterminated curly brackets"),
        ("^]$", UnsupportedPattern, "unsupported character: ]"),
        ("^" + "(" * (MAX_PATTERN_DEPTH + 1) + ")" * (MAX_PATTERN_DEPTH + 1) + "$", UnsupportedPattern,
         "pattern nesting too deep"),
        ("^(a$", InvalidPattern, "unbalanced parentheses"),
        ("^a)$", InvalidPattern, "unbalanced parentheses"),
        ("^*$", InvalidPattern, "nothing to repeat"),
        ("^{2}$", InvalidPattern, "nothing to repeat"),
        ("^[ab$", InvalidPattern, "unterminated character class"),
        ("^a\\$", InvalidPattern, "trailing backslash"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None,
)
def test_refusal(pattern: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as caught:
        pattern_to_rule(pattern, "p", Rules().add)
    assert str(caught.value) == message


def test_pattern_is_walked_byte_by_byte() -> None:
    # "é" is two bytes (C3 A9): the quantifier takes only the last one, as in llama.cpp
    table = Rules()
    pattern_to_rule("^\xc3\xa9+$", "p", table.add)
    assert table.rules["p"] == '"\\"" ("\xc3" "\xa9"+) "\\""'


@pytest.mark.oracle
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(patterns(), min_size=1, max_size=6))
def test_generated_patterns_convert_as_in_llama_cpp(
    batch: list[str], schema_oracle: Path, oracle_report: OracleReport
) -> None:
    properties = {f"p{i}": {"type": "string", "pattern": pattern} for i, pattern in enumerate(batch)}
    verdict = compare_conversion(schema_oracle, json.dumps({"type": "object", "properties": properties}))
    if verdict.verdict == "utf8-refused":  # llama.cpp's grammar is not UTF-8; we refuse by design
        oracle_report.add("schema refused, llama.cpp not", "pattern batches", identical=1, total=1)
        return
    identical = int(verdict.verdict == "identical")
    oracle_report.add("pattern grammars", "hypothesis (batches)", identical=identical, total=1)
    assert verdict.verdict == "identical", verdict.detail
