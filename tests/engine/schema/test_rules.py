"""The fixed GBNF pieces of the converter, compared with the tables and examples in llama.cpp's source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from constraintd.engine.schema.rules import (
    PRIMITIVE_RULES,
    RESERVED_NAMES,
    SPACE_RULE,
    STRING_FORMAT_RULES,
    BuiltinRule,
    format_literal,
    from_bytes,
    is_utf8,
    not_strings,
    to_bytes,
)
from tests.schema_oracle.cases import c_string

CONVERTER = "common/json-schema-to-grammar.cpp"
_ENTRY = re.compile(r'\{"(?P<name>[^"]+)",\s*\{"(?P<content>(?:[^"\\]|\\.)*)",\s*\{(?P<deps>[^}]*)\}\}\}')


def cpp_table(source: str, name: str) -> dict[str, BuiltinRule]:
    """A `static std::unordered_map<std::string, BuiltinRule> NAME = {...};` initializer, read."""
    start = source.index(f"BuiltinRule> {name} = {{")
    block = source[start : source.index("\n};", start)]
    return {
        entry["name"]: BuiltinRule(c_string(entry["content"]), tuple(re.findall(r'"([^"]*)"', entry["deps"])))
        for entry in _ENTRY.finditer(block)
    }


@pytest.fixture(scope="module")
def converter_source(llama_cpp_dir: Path) -> str:
    return (llama_cpp_dir / CONVERTER).read_text()


def test_primitive_rules_are_llamas(converter_source: str) -> None:
    table = cpp_table(converter_source, "PRIMITIVE_RULES")
    assert len(table) == 12
    assert table == PRIMITIVE_RULES


def test_string_format_rules_are_llamas(converter_source: str) -> None:
    table = cpp_table(converter_source, "STRING_FORMAT_RULES")
    assert len(table) == 6
    assert table == STRING_FORMAT_RULES


def test_space_rule_is_llamas(converter_source: str) -> None:
    match = re.search(r'const std::string SPACE_RULE = "((?:[^"\\]|\\.)*)";', converter_source)
    assert match is not None
    assert c_string(match.group(1)) == SPACE_RULE


def test_reserved_names_are_root_and_the_builtin_rules() -> None:
    assert {"root", *PRIMITIVE_RULES, *STRING_FORMAT_RULES} == RESERVED_NAMES
    assert "space" not in RESERVED_NAMES


def test_not_strings_examples_of_llamas_comment(converter_source: str) -> None:
    # the comment above `_not_strings` shows calls and their results: `not_strings({"a"}) -> ...`
    examples = re.findall(r"not_strings\(\{(.*?)\}\)\s*\n\s*-> (.*)", converter_source)
    assert len(examples) == 2
    for arguments, expected in examples:
        words = re.findall(r'"([^"]*)"', arguments)
        assert not_strings(words, "char") == expected.strip()


def test_not_strings_writes_code_points_whole_and_knows_the_empty_string() -> None:
    assert not_strings([to_bytes("é")], "c") == to_bytes('["] ( [é] c+ | [^"é] c* )? ["]')
    assert not_strings(["", "a"], "c") == '["] ( [a] c+ | [^"a] c* ) ["]'


def test_not_strings_of_a_long_name_does_not_recurse() -> None:
    rule = not_strings(["x" * 50_000], "c")
    assert rule.count("[x]") == 50_000


@pytest.mark.parametrize(
    ("literal", "text"),
    [("plain", '"plain"'), ('a"b', '"a\\"b"'), ("a\\b", '"a\\\\b"'), ("\r\n\t-]", '"\\r\\n\t-]"')],
    ids=["plain", "quote", "backslash", "controls"],
)
def test_format_literal_escapes_only_cr_lf_quote_backslash(literal: str, text: str) -> None:
    assert format_literal(literal) == text


def test_byte_strings() -> None:
    assert to_bytes("é") == "\xc3\xa9"
    assert from_bytes("\xc3\xa9") == "é"
    assert from_bytes("\xc3") == "\ufffd"
    assert is_utf8("\xc3\xa9")
    assert not is_utf8("\xc3 \xa9")
