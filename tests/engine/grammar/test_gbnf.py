"""The GBNF parser against llama.cpp: its own test vectors (read from its source tree), its grammars,
the refusals it makes, and llama.cpp itself deciding the same texts (oracle).

Sizes, with the pinned llama.cpp: 17 `verify_parsing` and 6 `verify_failure` vectors, 9 build cases and
14 `test_grammar` grammars of the integration test, 8 grammar files; 39 refusals with their place;
161 edge cases (tests/vectors/gbnf); 400 random texts. The oracle tests have llama.cpp build each of
about 260 fixed texts and 300 random ones (derandomized) with the llama-spm vocabulary, and run
llama.cpp's own parser (a small program compiled against libllama once, then cached) on those fixed
texts and 2,000 seeded random ones, comparing symbol ids and element vectors; about 15 seconds in all.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import random
import re
import shutil
import string
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constraintd.engine.grammar.gbnf import (
    CHAR_ESCAPES,
    ERRORS,
    HEX_ESCAPES,
    MAX_NESTING,
    MAX_REPEATED_ELEMENTS,
    GreType,
    ParsedGrammar,
    _Parser,
    check_grammar,
    forget_kept_classes,
    format_gbnf,
    parse_gbnf,
)
from constraintd.engine.schema.convert import convert_json_schema
from constraintd.errors import GrammarError, SchemaError
from tests import reference
from tests.engine.grammar.test_checks import CHECK_REFUSALS

if TYPE_CHECKING:
    from tests.conftest import OracleReport
    from tests.oracle import LlamaVocab

# --- llama.cpp's C++ test sources, read at test time ------------------------------------------------------

_RAW = r'R"""\((.*?)\)"""'  # the raw string literals llama.cpp's grammar tests write grammars in
_ELEMENT = r"\{LLAMA_GRETYPE_(\w+),\s*('(?:\\.|[^'])'|\d+)\s*\}"  # {LLAMA_GRETYPE_CHAR, 'a'}
_C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", "'": "'", '"': '"'}


@dataclass(frozen=True)
class ParserVector:
    """One `verify_parsing` call of tests/test-grammar-parser.cpp."""

    grammar: str
    symbol_ids: dict[str, int]
    elements: list[tuple[int, int]]


def _c_value(literal: str) -> int:
    # A C char literal ('a', '\n') or an unsigned integer, as the vectors write element values.
    if literal.startswith("'"):
        body = literal[1:-1]
        return ord(_C_ESCAPES[body[1]] if body.startswith("\\") else body)
    return int(literal)


def _source(name: str) -> str:
    return reference.require(reference.llama_cpp_dir() / "tests" / name).read_text(encoding="utf-8")


def parser_vectors() -> tuple[list[ParserVector], list[str]]:
    """The `verify_parsing` and `verify_failure` cases of tests/test-grammar-parser.cpp."""
    source = _source("test-grammar-parser.cpp")
    source = source[source.index("int main") :]
    parsing = []
    symbols_block = r"\{((?:\s*\{[^{}]*\},?)*\s*)\}"  # {{"root", 0}, {"root_1", 1}, ...}
    call_pattern = r"verify_parsing\(" + _RAW + r",\s*" + symbols_block + r",\s*\{(.*?)\}\);"
    for call in re.finditer(call_pattern, source, re.S):
        grammar, symbols, elements = call.groups()
        symbols = re.sub(r"//[^\n]*", "", symbols)
        elements = re.sub(r"//[^\n]*|/\*.*?\*/", "", elements)
        parsing.append(
            ParserVector(
                grammar=grammar,
                symbol_ids={name: int(i) for name, i in re.findall(r'\{"([^"]*)",\s*(\d+)\}', symbols)},
                elements=[
                    (GreType[kind], _c_value(value.strip())) for kind, value in re.findall(_ELEMENT, elements)
                ],
            )
        )
    failures = re.findall(r"verify_failure\(" + _RAW + r"\);", source, re.S)
    assert len(parsing) == source.count("verify_parsing(")
    assert len(failures) == source.count("verify_failure(")
    return parsing, failures


PARSING, FAILURES = parser_vectors()


def test_read_llama_cpp_parser_vectors() -> None:
    # 20 `verify_parsing` and 6 `verify_failure` calls in the pinned llama.cpp
    assert len(PARSING) > 0 and len(FAILURES) > 0
    assert all(vector.elements and vector.symbol_ids for vector in PARSING)


@pytest.mark.parametrize("vector", PARSING, ids=[f"parsing{i}" for i in range(len(PARSING))])
def test_llama_cpp_parsing_vectors(vector: ParserVector) -> None:
    parsed = parse_gbnf(vector.grammar)
    assert dict(parsed.symbol_ids) == vector.symbol_ids
    assert [element for rule in parsed.rules for element in rule] == vector.elements


@pytest.mark.parametrize("grammar", FAILURES, ids=[f"failure{i}" for i in range(len(FAILURES))])
def test_llama_cpp_failure_vectors(grammar: str) -> None:
    with pytest.raises(GrammarError):
        parse_gbnf(grammar)


@dataclass(frozen=True)
class BuildCase:
    """A grammar tests/test-grammar-integration.cpp builds with `root`: must it build (and parse)?"""

    grammar: str
    root: str
    builds: bool
    parses: bool | None  # None: the C++ test does not say


def integration_build_cases() -> list[BuildCase]:
    """The grammars of the `test_failure_*` and custom-root checks of tests/test-grammar-integration.cpp."""
    source = _source("test-grammar-integration.cpp")
    cases = []
    functions = r"\nstatic void test_(?:failure_\w+|custom_root_symbol_check)\(\) \{\n(.*?)\n\}\n"
    for body in re.findall(functions, source, re.S):
        strings = dict(re.findall(r"std::string (\w+)\s*=\s*" + _RAW + ";", body, re.S))
        for name in re.findall(r"assert\(test_build_grammar_fails\((\w+)\)\);", body):
            cases.append(BuildCase(strings[name], "root", builds=False, parses=None))
        for result, name, root in re.findall(r"(\w+) = build_grammar_with_root\((\w+), \"(\w+)\"\);", body):
            builds = f"assert({result} != nullptr);" in body
            assert builds or f"assert({result} == nullptr);" in body
            cases.append(BuildCase(strings[name], root, builds=builds, parses=None))
        for name in re.findall(r"parsed_grammar\.parse\((\w+)\.c_str\(\)\);", body):
            parses = "assert(!parsed_grammar.rules.empty());" in body
            assert parses or "assert(parsed_grammar.rules.empty());" in body
            no_root = (
                'assert(parsed_grammar.symbol_ids.find("root") == parsed_grammar.symbol_ids.end());' in body
            )
            assert not parses or no_root
            cases.append(BuildCase(strings[name], "root", builds=False, parses=parses))
    return cases


def integration_grammars() -> list[str]:
    """The grammar of every `test_grammar(...)` call of tests/test-grammar-integration.cpp (all build)."""
    source = _source("test-grammar-integration.cpp")
    calls = re.findall(r'\btest_grammar\(\s*"(?:[^"\\]|\\.)*",\s*(?://[^\n]*\s*)*' + _RAW, source, re.S)
    assert len(calls) == len(re.findall(r"\btest_grammar\(\s*\"", source))
    return calls


def reference_grammars() -> list[Path]:
    return sorted(reference.require(reference.llama_cpp_dir() / "grammars").glob("*.gbnf"))


BUILD_CASES = integration_build_cases()
INTEGRATION_GRAMMARS = integration_grammars()
GRAMMAR_FILES = reference_grammars()


def test_read_llama_cpp_integration_cases() -> None:
    # 9 build cases (4 left recursion, missing root, missing reference, 3 custom roots) and
    # 14 `test_grammar` grammars in the pinned llama.cpp; 8 grammars/*.gbnf
    assert len(BUILD_CASES) > 0 and len(INTEGRATION_GRAMMARS) > 0 and len(GRAMMAR_FILES) > 0
    assert any(case.builds for case in BUILD_CASES) and not all(case.builds for case in BUILD_CASES)


def builds(text: str, root: str = "root") -> bool:
    try:
        check_grammar(parse_gbnf(text), root)
    except GrammarError:
        return False
    return True


@pytest.mark.parametrize("case", BUILD_CASES, ids=[f"build{i}" for i in range(len(BUILD_CASES))])
def test_llama_cpp_build_cases(case: BuildCase) -> None:
    if case.parses is not None:
        try:
            parse_gbnf(case.grammar)
        except GrammarError:
            assert not case.parses
        else:
            assert case.parses
    assert builds(case.grammar, case.root) == case.builds


@pytest.mark.parametrize(
    "grammar", INTEGRATION_GRAMMARS, ids=[f"grammar{i}" for i in range(len(INTEGRATION_GRAMMARS))]
)
def test_llama_cpp_integration_grammars_build(grammar: str) -> None:
    assert builds(grammar)


@pytest.mark.parametrize("path", GRAMMAR_FILES, ids=[path.stem for path in GRAMMAR_FILES])
def test_llama_cpp_grammar_files_build(path: Path) -> None:
    parsed = parse_gbnf(path.read_text(encoding="utf-8"))
    assert check_grammar(parsed) == parsed.symbol_ids["root"]


# --- refusals: llama.cpp's message, and where -------------------------------------------------------------

_DEEP = MAX_NESTING + 1
_LONG = 3000  # a literal this long repeated 2000 times is more than MAX_REPEATED_ELEMENTS elements

# (message key, grammar, message fields, line, column); hand-written, columns counted by hand.
REFUSALS: list[tuple[str, str, dict[str, object], int, int]] = [
    ("hex", 'root ::= "\\x4"', {"size": 2}, 1, 13),
    ("hex", "root ::= [\\u12G4]", {"size": 4}, 1, 13),
    ("hex", 'root ::= "\\U0001F60"', {"size": 8}, 1, 13),
    ("name", 'root ::= "a"\n| "b"', {}, 2, 1),
    ("integer", "root ::= <[]>", {}, 1, 12),
    ("escape", 'root ::= "\\q"', {}, 1, 11),
    ("escape", 'root ::= "\\', {}, 1, 11),
    ("end", 'root ::= "abc', {}, 1, 14),
    ("end", "root ::= [abc", {}, 1, 14),
    ("end", "root ::= [a-", {}, 1, 13),
    ("token_open", 'root ::= !"a"', {}, 1, 11),
    ("token_id_too_big", "root ::= <[4294967296]>", {}, 1, 12),
    ("token_id_range", "root ::= <[18446744073709551616]>", {}, 1, 12),
    ("token_bracket", "root ::= <[12>", {}, 1, 14),
    ("token_close", "root ::= <[12]", {}, 1, 15),
    ("no_vocab", "root ::= <think>", {}, 1, 10),
    ("repeat_what", "root ::= *", {}, 1, 10),
    ("repeat_what", 'root ::= "a" | ?', {}, 1, 16),
    ("repeat_what", 'root ::= "a"{0}{2}', {}, 1, 16),
    ("repeat_rules", 'root ::= ("a"{0,50}){0,50}', {}, 1, 21),
    ("group_close", 'root ::= ("a"', {}, 1, 14),
    ("group_close", 'root ::= ("a"]', {}, 1, 14),
    ("repeat_int", 'root ::= "a"{,}', {}, 1, 14),
    ("repeat_close", 'root ::= "a"{1,2', {}, 1, 17),
    ("repeat_comma", 'root ::= "a"{1 2}', {}, 1, 16),
    ("repeat_range", 'root ::= "a"{18446744073709551616}', {}, 1, 14),
    ("repeat_range", 'root ::= "a"{1,' + "9" * 5000 + "}", {}, 1, 16),
    ("repeat_many", 'root ::= "a"{2001}', {}, 1, 13),
    ("assign", 'root = "a"', {}, 1, 6),
    ("assign", 'root\n::= "a"', {}, 1, 5),
    ("newline", 'root ::= "a")', {}, 1, 13),
    ("newline", 'x ::= "a"\r\nroot ::= "b" ]', {}, 2, 14),
    ("undefined", 'a ::= b\nc ::= "y"\na ::= "x"', {}, 1, 7),
    ("undefined_name", 'root ::= "a" foo', {"name": "foo"}, 1, 14),
    ("undefined_name", 'root ::= ("a" | foo)*\r\n', {"name": "foo"}, 1, 17),
    ("repeat_reversed", 'root ::= "a"{3,2}', {"min": 3, "max": 2}, 1, 13),
    ("repeat_reversed", 'root ::= "a"{1,0}', {"min": 1, "max": 0}, 1, 13),
    ("nesting", "root ::= " + "(" * _DEEP + '"a"' + ")" * _DEEP, {}, 1, 10 + MAX_NESTING),
    ("too_large", 'root ::= "' + "a" * _LONG + '"{2000}', {}, 1, 12 + _LONG),
]


@pytest.mark.parametrize(
    ("key", "text", "fields", "line", "column"),
    REFUSALS,
    ids=[f"{case[0]}{i}" for i, case in enumerate(REFUSALS)],
)
def test_refusal_reason_and_place(
    key: str, text: str, fields: dict[str, object], line: int, column: int
) -> None:
    with pytest.raises(GrammarError) as refused:
        parse_gbnf(text)
    assert (refused.value.reason, refused.value.line, refused.value.column) == (
        ERRORS[key].format(**fields),
        line,
        column,
    )
    assert refused.value.excerpt and refused.value.excerpt in text.splitlines()[line - 1]


def test_invalid_token_reason() -> None:
    with pytest.raises(GrammarError) as refused:
        parse_gbnf("root ::= <think> <nope>", token_id={"<think>": 7}.get)
    assert (refused.value.reason, refused.value.column) == (ERRORS["invalid_token"].format(text="<nope>"), 18)


def test_token_terminals() -> None:
    texts: list[str] = []

    def token_id(text: str) -> int:
        texts.append(text)
        return len(texts)

    parsed = parse_gbnf("root ::= <think> !<[5]> <[4294967295]> !<a\nb>", token_id=token_id)
    assert texts == ["<think>", "<a\nb>"]  # the whole terminal, brackets included
    assert parsed.rules[0] == (
        (GreType.TOKEN, 1),
        (GreType.TOKEN_NOT, 5),
        (GreType.TOKEN, 4294967295),
        (GreType.TOKEN_NOT, 2),
        (GreType.END, 0),
    )


def test_every_refusal_message_is_exercised() -> None:
    exercised = {case[0] for case in REFUSALS} | {case[0] for case in CHECK_REFUSALS} | {"invalid_token"}
    exercised |= {"bad_reference", "malformed", "end_inside", "char_modifier", "unknown_element"}  # below
    assert exercised == set(ERRORS)


# --- what the parser builds -------------------------------------------------------------------------------


def _parse_char_cases() -> dict[str, int | str]:
    # llama.cpp's parse_char, read from its source: escape char -> code point, or -> "hex<n>".
    source = reference.require(reference.llama_cpp_dir() / "src" / "llama-grammar.cpp").read_text()
    body = source[source.index("parse_char(const char * src) {") :]
    body = body[: body.index("\n}\n")]
    table: dict[str, int | str] = {}
    pending: list[str] = []
    for case, action in re.findall(r"case '(\\?.)':\s*(return [^;]*;)?", body):
        pending.append(case.encode().decode("unicode_escape"))
        if action:
            hex_size = re.search(r"parse_hex\(src \+ 2, (\d)\)", action)
            char = re.search(r"make_pair\('(\\?.)'", action)
            for escape in pending:
                if hex_size:
                    table[escape] = f"hex{hex_size.group(1)}"
                else:
                    table[escape] = ord(char.group(1).encode().decode("unicode_escape") if char else escape)
            pending = []
    return table


def test_escape_tables_are_llama_cpp_parse_char() -> None:
    ours = {**CHAR_ESCAPES, **{escape: f"hex{size}" for escape, size in HEX_ESCAPES.items()}}
    assert ours == _parse_char_cases()


@pytest.mark.parametrize(
    ("escape", "code_point"),
    [
        *CHAR_ESCAPES.items(),
        ("x41", 0x41),
        ("xfF", 0xFF),
        ("u00e9", 0xE9),
        ("uFFFF", 0xFFFF),
        ("U0001F600", 0x1F600),
        ("UFFFFFFFF", 0xFFFFFFFF),
    ],
    ids=lambda value: repr(value),
)
def test_escapes(escape: str, code_point: int) -> None:
    parsed = parse_gbnf(f'root ::= "\\{escape}" [\\{escape}]')
    assert parsed.rules[0] == ((GreType.CHAR, code_point), (GreType.CHAR, code_point), (GreType.END, 0))


def test_non_ascii_text_is_read_by_code_point() -> None:
    parsed = parse_gbnf('root ::= "é😀" [α-ω] [^\U0010ffff]')
    assert [value for _, value in parsed.rules[0][:-1]] == [0xE9, 0x1F600, 0x3B1, 0x3C9, 0x10FFFF]


@pytest.mark.parametrize(
    ("text", "same_as"),
    [
        ('root ::= "a" | b\r\nb ::= "b"\r\n', 'root ::= "a" | b\nb ::= "b"\n'),
        ('root ::= "a" | b\rb ::= "b"', 'root ::= "a" | b\nb ::= "b"'),
        ('root ::= "a" # comment | b\n# another\nb ::= "b" # at the end', 'root ::= "a"\nb ::= "b"'),
        ('root ::= (\n  "a"\n  | b # c\n)\nb ::= "b"', 'root ::= ("a" | b)\nb ::= "b"'),
        ('root ::= "a"\0 garbage ::= \\', 'root ::= "a"'),
        ('\t root ::=\n\n "a"\t', 'root ::= "a"'),
        ('root ::= "a" "b"\nroot ::= "c"', 'root ::= "c"'),
    ],
    ids=["crlf", "lone-cr", "comments", "newlines-in-groups", "nul-ends-text", "spaces", "redefined"],
)
def test_same_rules(text: str, same_as: str) -> None:
    assert parse_gbnf(text) == parse_gbnf(same_as)


def test_repetition_of_a_repetition_and_empty_items() -> None:
    # `S**` repeats the generated reference; `{0}` removes S; `[]` and `""` produce no element.
    assert parse_gbnf('root ::= "a"**').rules == (
        ((GreType.RULE_REF, 2), (GreType.END, 0)),
        ((GreType.CHAR, 97), (GreType.RULE_REF, 1), (GreType.ALT, 0), (GreType.END, 0)),
        ((GreType.RULE_REF, 1), (GreType.RULE_REF, 2), (GreType.ALT, 0), (GreType.END, 0)),
    )
    assert parse_gbnf('root ::= "x" "a"{0} [] "" [^]').rules == (((GreType.CHAR, 120), (GreType.END, 0)),)


def test_repetition_maximum_past_the_threshold_means_no_maximum() -> None:
    assert parse_gbnf('root ::= "a"{2,2001}') == parse_gbnf('root ::= "a"{2,}')


def test_char_class_dashes() -> None:
    rule = parse_gbnf("root ::= [-a-c-]").rules[0]
    assert rule == (
        (GreType.CHAR, 45),
        (GreType.CHAR_ALT, 97),
        (GreType.CHAR_RNG_UPPER, 99),
        (GreType.CHAR_ALT, 45),
        (GreType.END, 0),
    )


def test_rule_names_are_llama_cpp_word_chars() -> None:
    assert parse_gbnf('root ::= a-1 9\na-1 ::= "x"\n9 ::= "y"').symbol_ids == {"root": 0, "a-1": 1, "9": 2}
    for text in ('root ::= "a"\nroot_1 ::= "b"', 'röot ::= "a"', "root ::= ä"):
        with pytest.raises(GrammarError):
            parse_gbnf(text)


def test_nesting_up_to_the_limit() -> None:
    parsed = parse_gbnf("root ::= " + "(" * MAX_NESTING + '"a"' + ")" * MAX_NESTING)
    assert len(parsed.rules) == MAX_NESTING + 1
    assert check_grammar(parsed) == 0


def test_hostile_sizes_are_refused_or_parsed_without_recursion() -> None:
    # Far past Python's recursion limit (1,000 frames); the work is linear in the text.
    with pytest.raises(GrammarError):
        parse_gbnf("root ::= " + "(" * 200_000)
    with pytest.raises(GrammarError):
        parse_gbnf('root ::= "a"{2000}\n' * (MAX_REPEATED_ELEMENTS // 1999 + 1))
    long = parse_gbnf('root ::= "' + "ab" * 50_000 + '" x\nx ::= ' + " | ".join(["[a-z]"] * 10_000))
    assert len(long.rules[0]) == 100_002


# --- arbitrary text ---------------------------------------------------------------------------------------

# Pieces of GBNF, right and wrong, that random texts are made of.
PIECES = [
    "root", "a", "b-1", "9", " ::= ", "::=", ":", " ", "\n", "\r\n", "\r", "\t", "|", "(", ")", '"', '"a"',
    '"\\x41"', '"\\u00e9"', "\\", "\\n", "[", "]", "^", "-", "[a-z]", "[^\n]", "[]", "*", "+", "?", "{", "}",
    ",", "0", "2", "{2}", "{0,3}", "{1,}", "{2,1}", "{0}", ".", "#c", "<[3]>", "!<[4]>", "<s>", "<x>", "<",
    ">", "!", "\0", "é", "_1", "x",
]  # fmt: skip
# Items of well-formed rule bodies (groups may come out unbalanced), for texts that mostly build.
ITEMS = [
    '"a"', '"bc"', "[a-z]", "[^x]", '("a" | x)', '(x "b")*', "( [x]* )", "(", ")", "|", "*", "+", "?", "{2}",
    "{0,3}", "{1,}", ".", "x", "root", "<[3]>", "!<[4]>", "<s>", '""', "[]", '"a"', "x", "[0-9]",
]  # fmt: skip
piece_texts = st.lists(st.sampled_from(PIECES), max_size=30).map("".join)
rule_texts = st.builds(
    "root ::= {}\nx ::= {}".format,
    st.lists(st.sampled_from(ITEMS), max_size=12).map(" ".join),
    st.lists(st.sampled_from(ITEMS), max_size=8).map(" ".join),
)

# Well-formed bodies, built up from terminals by sequence, alternation and repetition.
bodies = st.recursive(
    st.sampled_from(['"a"', "[a-z]", ".", "x", "<s>", "<[3]>", "!<[4]>", '""', "[^x]", '"\\n"']),
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(" ".join),
        st.lists(inner, min_size=1, max_size=3).map(lambda items: "(" + " | ".join(items) + ")"),
        st.tuples(inner, st.sampled_from(["*", "+", "?", "{2}", "{0,3}", "{1,}", "{0}"])).map(
            "({0[0]}){0[1]}".format
        ),
    ),
    max_leaves=8,
)
grammar_texts = st.builds("root ::= {}\nx ::= {}".format, bodies, bodies)
gbnf_texts = st.one_of(piece_texts, rule_texts, grammar_texts, st.text(max_size=200))


def _token_id(text: str) -> int | None:
    return {"<s>": 1}.get(text)


def _assert_well_formed(parsed: ParsedGrammar) -> None:
    for rule in parsed.rules:
        assert rule and rule[-1] == (GreType.END, 0) and (GreType.END, 0) not in rule[:-1]
        assert all(value < len(parsed.rules) for kind, value in rule if kind == GreType.RULE_REF)
    assert sorted(parsed.symbol_ids.values()) == list(range(len(parsed.symbol_ids)))


@settings(max_examples=400, deadline=None)
@given(gbnf_texts)
def test_any_text_is_parsed_or_refused_with_a_grammar_error(text: str) -> None:
    try:
        parsed = parse_gbnf(text, token_id=_token_id)
    except GrammarError as refused:
        assert refused.reason in _ERROR_REASONS or _reason_key(refused.reason)
        return
    _assert_well_formed(parsed)
    format_gbnf(parsed)
    try:
        check_grammar(parsed)
    except GrammarError as refused:
        assert _reason_key(refused.reason)


# --- rules read at once: the same result as the general loop's ------------------------------------------
#
# A rule of references, literals and char classes alone is read by one pattern (`simple_rule`); anything
# else by the general loop, which llama.cpp's parser is ported to statement by statement. The two must agree
# on every text: the symbol ids (in order), the element vectors, and each refusal with its place.

# Items of simple rules, and what lies next to them in real texts: escapes well formed or not, blanks,
# comments, newlines after `|` and between rules, and the pieces that send a rule to the general loop.
SIMPLE_PIECES = [
    "x", "x-y", "root", "a1", '"a"', '""', '"\\""', '"\\x41"', '"\\u00e9"', '"\\U0001F600"', '"\\q"',
    '"\\x4"', '"#"', '"|"', '"é"', "[a-z]", "[^x]", "[]", "[^]", '[^"\\\\\\x7F\\x00-\\x1F]', "[\\]]",
    "[a-]", "[\\x4]", "[-a]", " ", "  ", "\t", "|", "| ", "|\n ", "|\r\n", " # c", "\n", "\r", "\r\n",
    "\nx ::= ", "\ny ::= ", " ::= ", "(", ")", "*", "?", ".", "<s>", "{2}",
]  # fmt: skip
simple_texts = st.builds(
    "root ::= {}\nx ::= {}\ny ::= {}".format,
    *[st.lists(st.sampled_from(SIMPLE_PIECES), max_size=10).map("".join) for _ in range(3)],
)


def _read_both_ways(text: str) -> tuple[object, object]:
    """What parsing `text` gives with simple rules read at once, and with every rule read by the general
    loop: the symbol ids in order and the rules, or the refusal with its place."""

    def outcome(simple: bool) -> object:
        try:
            parsed = _Parser(text, _token_id, simple=simple).parse()
        except GrammarError as refused:
            return (refused.reason, refused.line, refused.column, refused.excerpt)
        return (list(parsed.symbol_ids.items()), parsed.rules)

    return outcome(True), outcome(False)


@settings(max_examples=600, deadline=None)
@given(st.one_of(simple_texts, gbnf_texts))
def test_rules_read_at_once_as_the_general_loop_reads_them(text: str) -> None:
    at_once, general = _read_both_ways(text)
    assert at_once == general


def test_converter_grammars_and_random_texts_read_at_once_as_the_general_loop_reads_them() -> None:
    # every grammar both dialects write for the MaskBench sample, and texts of the generator the oracle uses
    sample = Path(__file__).parents[2] / "vectors" / "maskbench-sample"
    texts = _random_texts(1000, seed=1)
    for path in sorted(sample.glob("*.json")):
        schema = json.dumps(json.loads(path.read_text(encoding="utf-8"))["schema"])
        for dialect in ("llama.cpp", "extended"):
            with contextlib.suppress(SchemaError):
                texts.append(convert_json_schema(schema, dialect=dialect).grammar)
    assert len(texts) > 1400
    for text in texts:
        at_once, general = _read_both_ways(text)
        assert at_once == general, text


@pytest.mark.parametrize("rest", ["", "a", "ab", "-", "-a", "a-c", "\\-", "\\x20-\\x7E", "é", "\\]", "F-Z"])
def test_a_class_opening_as_a_json_string_s_characters_reads_as_any_class(rest: str) -> None:
    # `[^"\\\x7F\x00-\x1F` and more: its first items come read, the rest is read on its own
    text = f'root ::= [^"\\\\\\x7F\\x00-\\x1F{rest}] "."\n'
    forget_kept_classes()
    at_once, general = _read_both_ways(text)
    assert at_once == general


def test_simple_rules_are_read_without_the_general_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # the grammar of keys other than "a" of the extended dialect: rules of references, literals with
    # escapes, negated classes and alternates, blanks and a comment between rules
    text = (
        'root ::= "\\"" x-key-at-0\n'
        'x-key-at-0 ::= "a" x-key-more | x-key-not-61\n'
        "# the tails\n"
        'x-key-not-61 ::= [^"\\\\\\x7F\\x00-\\x1Fa] x-key-tail |\n    x-key-end\r\n'
        'x-key-end ::= "\\"" | [\\\\] ["\\\\bfnrt] x-key-tail | "\\\\u0022" x-key-tail\n'
        'x-key-more ::= [^"\\\\\\x7F\\x00-\\x1F] x-key-tail\n'
        'x-key-tail ::= "\\"" | x-key-more'
    )
    expected = parse_gbnf(text)
    assert len(expected.rules) == 6

    def general_loop(*args: object) -> int:
        raise AssertionError("a simple rule went to the general loop")

    monkeypatch.setattr(_Parser, "parse_alternates", general_loop)
    assert parse_gbnf(text) == expected


def test_an_undefined_name_in_a_simple_rule_is_refused_at_its_first_reference() -> None:
    with pytest.raises(GrammarError) as refused:
        parse_gbnf('root ::= a "x" | b\na ::= "y" b')
    assert (refused.value.line, refused.value.column) == (1, 18)
    assert refused.value.reason == ERRORS["undefined_name"].format(name="b")


def _template_pattern(template: str) -> re.Pattern[str]:
    parts = [
        re.escape(literal) + ("(.*)" if field is not None else "")
        for literal, field, _, _ in string.Formatter().parse(template)
    ]
    return re.compile("".join(parts), re.S)


_ERROR_PATTERNS = {key: _template_pattern(template) for key, template in ERRORS.items()}
_ERROR_REASONS = frozenset(template for template in ERRORS.values() if "{" not in template)


def _reason_key(reason: str) -> str:
    """The key of `ERRORS` whose message `reason` is ("" if none)."""
    return next((key for key, pattern in _ERROR_PATTERNS.items() if pattern.fullmatch(reason)), "")


# --- llama.cpp deciding the same texts (oracle) -----------------------------------------------------------

# Hand-written texts at the edges of the syntax, each decided by llama.cpp in the oracle tests below.
TRICKY: list[str] = json.loads(
    (Path(__file__).parents[2] / "vectors" / "gbnf" / "edge_cases.json").read_text(encoding="utf-8")
)

# Texts llama.cpp never returns from (or crashes on), that the oracle must never be given, and what
# constraintd answers instead; checked without llama.cpp below.
NEVER_FEED: list[tuple[str, str, str]] = [
    ('root ::= "a"{5,3}', "root", "repeat_reversed"),  # generates rules until memory runs out
    ('root ::= ("a"){3,0}', "root", "repeat_reversed"),
    ("root ::= " + "(" * 30_000 + '"a"' + ")" * 30_000, "root", "nesting"),  # overflows the C stack
    ('root ::= b\nroot ::= "a"', "b", "no_root"),  # `b` has an id but no rule: reads past the rules
    ('root ::= x root "c" | "a"\nx ::= y\ny ::= "" | "b"', "root", ""),  # builds stacks without end
    ("".join(f"r{i} ::= r{i + 1} | r{i + 1}\n" for i in range(60)) + 'r60 ::= "z"\nroot ::= r0', "root", ""),
    # ^ llama.cpp's left recursion search takes 2**60 steps here (it does not remember finished rules)
]


@pytest.mark.parametrize(
    ("text", "root", "key"), NEVER_FEED, ids=[f"never-feed{i}" for i in range(len(NEVER_FEED))]
)
def test_where_llama_cpp_never_returns(text: str, root: str, key: str) -> None:
    try:
        check_grammar(parse_gbnf(text), root)
    except GrammarError as refused:
        assert _reason_key(refused.reason) == key
    else:
        assert key == ""


def _alternates(rule: tuple[tuple[int, int], ...]) -> Iterator[list[tuple[int, int]]]:
    alternate: list[tuple[int, int]] = []
    for element in rule:
        if element[0] in (GreType.ALT, GreType.END):
            yield alternate
            alternate = []
        else:
            alternate.append(element)


def _never_returns_in_llama_cpp(parsed: ParsedGrammar) -> bool:
    # llama.cpp's stack expansion grows without end on a left cycle through rules that derive the
    # empty string (its check sees only rules with an empty alternate) when a step of the cycle leaves
    # something after the reference to push below it. Left references: (rule, referenced, at the tail).
    rules = [list(_alternates(rule)) for rule in parsed.rules]
    nullable = [False] * len(rules)
    changed = True
    while changed:  # small grammars only
        changed = False
        for rule_id, alternates in enumerate(rules):
            if not nullable[rule_id] and any(
                all(kind == GreType.RULE_REF and nullable[value] for kind, value in alternate)
                for alternate in alternates
            ):
                nullable[rule_id] = changed = True
    left: list[tuple[int, int, bool]] = []
    for rule_id, alternates in enumerate(rules):
        for alternate in alternates:
            for index, (kind, value) in enumerate(alternate):
                if kind != GreType.RULE_REF:
                    break
                left.append((rule_id, value, index == len(alternate) - 1))
                if not nullable[value]:
                    break

    def reaches(start: int, goal: int) -> bool:
        seen, todo = {start}, [start]
        while todo:
            rule_id = todo.pop()
            if rule_id == goal:
                return True
            for _, ref in ((r, v) for r, v, _ in left if r == rule_id):
                if ref not in seen:
                    seen.add(ref)
                    todo.append(ref)
        return False

    return any(not tail and reaches(ref, rule_id) for rule_id, ref, tail in left)


@pytest.fixture(scope="module")
def spm_vocab() -> Iterator[LlamaVocab]:
    """llama.cpp's llama-spm vocabulary (32,000 tokens), loaded by llama.cpp."""
    from tests.oracle import LlamaVocab

    with LlamaVocab(reference.require(reference.vocab_path("llama-spm"))) as vocab:
        yield vocab


def _llama_cpp_token_id(vocab: LlamaVocab) -> Callable[[str], int | None]:
    def token_id(text: str) -> int | None:
        tokens = vocab.tokenize(text.encode(), add_special=False, parse_special=True)
        return tokens[0] if len(tokens) == 1 else None

    return token_id


_OURS_ONLY = frozenset({"repeat_reversed", "nesting", "too_large"})


# The messages llama.cpp ends with " at <the rest of the text>": we give the same spot as line and column
# (except for `repeat_what`, where we point at the operator, llama.cpp past it).
_AT_KEYS = frozenset(
    {
        "hex", "name", "integer", "escape", "token_open", "token_id_too_big", "token_bracket", "token_close",
        "no_vocab", "repeat_what", "group_close", "repeat_int", "repeat_close", "repeat_comma", "assign",
        "newline",
    }
)  # fmt: skip


@contextlib.contextmanager
def _llama_cpp_messages() -> Iterator[list[str]]:
    """Collect what llama.cpp writes meanwhile: its parser's stderr and its log (filled on exit)."""
    import llama_cpp

    from tests import oracle

    written: list[str] = []
    logger = llama_cpp.llama_log_callback(lambda level, text, user_data: written.append(text.decode()))
    llama_cpp.llama_log_set(logger, ctypes.c_void_p(0))
    stderr = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield written
        finally:
            os.dup2(stderr, 2)
            os.close(stderr)
            oracle.quiet_logs()
            llama_cpp.llama_log_set(oracle._LOG_CALLBACK, ctypes.c_void_p(0))
            sink.seek(0)
            written.insert(0, sink.read().decode())


def _offset(text: str, line: int, column: int) -> int:
    starts = [0, *(found.end() for found in re.finditer(r"\r\n?|\n", text))]
    return starts[line - 1] + column - 1


def _messages(vocab: LlamaVocab, text: str, root: str) -> tuple[str, str] | None:
    """What we and llama.cpp say of a grammar: "" when it builds, else the refusal as llama.cpp words it.

    None where llama.cpp must not be asked (it would not return, or does not refuse at all).
    """
    from tests.oracle import LlamaGrammar

    source = text.split("\0", 1)[0]  # what llama.cpp reads of it
    if source == "" or any(0xD800 <= ord(char) < 0xE000 for char in text):
        return None  # "" is no grammar at all to llama.cpp's sampler; lone surrogates are not UTF-8
    parsed = None
    ours = ""
    try:
        parsed = parse_gbnf(text, token_id=_llama_cpp_token_id(vocab))
        check_grammar(parsed, root)
    except GrammarError as refused:
        key = _reason_key(refused.reason)
        if key in _OURS_ONLY or (parsed is not None and key == "no_root" and root in parsed.symbol_ids):
            return None
        ours = "failed to parse grammar" if key == "no_rules" else refused.reason
        if key in _AT_KEYS - {"repeat_what"}:
            ours += " at " + source[_offset(text, refused.line, refused.column) :]
    else:
        if _never_returns_in_llama_cpp(parsed):
            return None
    with _llama_cpp_messages() as written:
        sampler = LlamaGrammar.create(vocab, text, root=root)
    if sampler is not None:
        sampler.close()
        return ours, ""
    stderr, log = written[0], "".join(written[1:])
    parse_error = re.match(r"parse: error parsing grammar: (.*)\n\n", stderr, re.S)
    if parse_error:
        theirs = stderr[parse_error.start(1) : -len(f"\n\n{source}\n")]
        if theirs.startswith(ERRORS["repeat_what"].format() + " at "):
            theirs = ERRORS["repeat_what"].format()
        return ours, theirs
    return ours, log.strip()


def oracle_cases() -> list[tuple[str, str]]:
    """(grammar, root) of every vector above, for llama.cpp to decide too."""
    cases = [(vector.grammar, "root") for vector in PARSING] + [(text, "root") for text in FAILURES]
    cases += [(case.grammar, case.root) for case in BUILD_CASES]
    cases += [(text, "root") for text in INTEGRATION_GRAMMARS]
    cases += [(path.read_text(encoding="utf-8"), "root") for path in GRAMMAR_FILES]
    cases += [(text, "root") for _, text, *_ in REFUSALS]
    cases += [(text, root) for _, text, root, _ in CHECK_REFUSALS]
    cases += [(text, "root") for text in TRICKY]
    return cases


@pytest.mark.oracle
def test_builds_and_refuses_as_llama_cpp_with_its_messages(
    spm_vocab: LlamaVocab, oracle_report: OracleReport
) -> None:
    differ = []
    asked = refused = 0
    for text, root in oracle_cases():
        said = _messages(spm_vocab, text, root)
        if said is not None:
            asked += 1
            refused += said[1] != ""
            if said[0] != said[1]:
                differ.append((text, root, said))
    oracle_report.add(
        "grammars built or refused (with the message)",
        "llama-spm",
        identical=asked - len(differ),
        total=asked,
    )
    assert asked > len(TRICKY) and 0 < refused < asked
    assert differ == []


@pytest.mark.oracle
@settings(max_examples=300, deadline=None, derandomize=True)
@given(text=st.one_of(piece_texts, rule_texts, grammar_texts))
def test_random_texts_built_and_refused_as_llama_cpp(
    spm_vocab: LlamaVocab, oracle_report: OracleReport, text: str
) -> None:
    said = _messages(spm_vocab, text, "root")
    if said is not None:
        oracle_report.add(
            f"random grammars {'refused' if said[1] else 'built'}",
            "llama-spm",
            identical=int(said[0] == said[1]),
            total=1,
        )
        assert said[0] == said[1]


# --- llama.cpp's own parser, element for element (oracle) -------------------------------------------------

# Compiled in the test setup against libllama (which exports llama_grammar_parser) and the reference's
# src/llama-grammar.h; cached under the reference cache, keyed by everything that goes into it.
_PARSER_HARNESS = r"""
// llama.cpp's own GBNF parser (llama_grammar_parser, exported by libllama) on grammars read from stdin,
// each as "<byte count>\n<bytes>". For each it prints "<ok|err> <symbols> <rules>", then "<id> <name>" per
// symbol and "<elements> <type> <value> ..." per rule.
#include "llama-grammar.h"

#include <cstdio>
#include <iostream>
#include <string>

int main(int argc, char ** argv) {
    llama_log_set([](enum ggml_log_level, const char *, void *) {}, nullptr);
    const llama_vocab * vocab = nullptr;
    if (argc > 1) {
        llama_model_params params = llama_model_default_params();
        params.vocab_only = true;
        llama_model * model = llama_model_load_from_file(argv[1], params);
        if (model == nullptr) {
            return 2;
        }
        vocab = llama_model_get_vocab(model);
    }
    size_t size = 0;
    while (std::cin >> size) {
        std::cin.get();
        std::string text(size, '\0');
        std::cin.read(text.data(), static_cast<std::streamsize>(size));
        llama_grammar_parser parser(vocab);
        const bool ok = parser.parse(text.c_str());
        std::printf("%s %zu %zu\n", ok ? "ok" : "err", parser.symbol_ids.size(), parser.rules.size());
        for (const auto & [name, id] : parser.symbol_ids) {
            std::printf("%u %s\n", id, name.c_str());
        }
        for (const auto & rule : parser.rules) {
            std::printf("%zu", rule.size());
            for (const auto & element : rule) {
                std::printf(" %d %u", static_cast<int>(element.type), element.value);
            }
            std::printf("\n");
        }
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def llama_cpp_parser() -> Path:
    """A program running llama.cpp's `llama_grammar_parser` on grammars (see `_PARSER_HARNESS`)."""
    import llama_cpp

    site = Path(llama_cpp.__file__).parent
    include, lib = reference.require(site.parent / "include"), reference.require(site / "lib")
    header = reference.require(reference.llama_cpp_dir() / "src" / "llama-grammar.h")
    command = ["g++", "-std=c++17", "-O1", "-w", f"-I{include}", f"-I{header.parent}", "harness.cpp", "-o"]
    libraries = [f"-L{lib}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}"]
    key = hashlib.sha256(
        "\0".join(
            [_PARSER_HARNESS, header.read_text(), str((lib / "libllama.so").stat().st_size), *command]
        ).encode()
    ).hexdigest()[:16]
    binary = reference.cache_dir() / f"gbnf-parser-{key}" / "harness"
    if not binary.exists():
        with tempfile.TemporaryDirectory() as build:
            (Path(build) / "harness.cpp").write_text(_PARSER_HARNESS)
            subprocess.run([*command, "harness", *libraries], cwd=build, check=True, timeout=600)
            binary.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(Path(build) / "harness", binary)
    return binary


def llama_cpp_parse(parser: Path, vocab: Path, texts: list[str]) -> list[ParsedGrammar | None]:
    """What llama.cpp's parser builds of each text (None where it refuses), one process for them all."""
    sources = [text.split("\0", 1)[0].encode() for text in texts]
    written = b"".join(b"%d\n%s" % (len(source), source) for source in sources)
    lines = iter(
        subprocess.run([parser, vocab], input=written, capture_output=True, check=True, timeout=600)
        .stdout.decode()
        .splitlines()
    )
    parsed: list[ParsedGrammar | None] = []
    for _ in texts:
        verdict, n_symbols, n_rules = next(lines).split()
        symbol_ids = {name: int(i) for i, name in (next(lines).split() for _ in range(int(n_symbols)))}
        rules = []
        for _ in range(int(n_rules)):
            numbers = [int(number) for number in next(lines).split()[1:]]
            rules.append(tuple(zip(numbers[::2], numbers[1::2], strict=True)))
        parsed.append(ParsedGrammar(symbol_ids=symbol_ids, rules=tuple(rules)) if verdict == "ok" else None)
    return parsed


def _random_texts(count: int, seed: int) -> list[str]:
    # Texts of GBNF pieces, of rule items and of well-formed nested bodies, from a seeded generator.
    chooser = random.Random(seed)

    def body(depth: int) -> str:
        form = chooser.randrange(4 if depth < 3 else 1)
        if form == 0:
            return chooser.choice(['"a"', "[a-z]", ".", "x", "<s>", "<[3]>", "!<[4]>", '""', "[^x]", '"\\n"'])
        parts = [body(depth + 1) for _ in range(chooser.randint(1, 3))]
        if form == 1:
            return " ".join(parts)
        if form == 2:
            return "(" + " | ".join(parts) + ")"
        return f"({parts[0]})" + chooser.choice(["*", "+", "?", "{2}", "{0,3}", "{1,}", "{0}", "{1,2}"])

    texts = []
    for i in range(count):
        if i % 3 == 0:
            texts.append("".join(chooser.choices(PIECES, k=chooser.randint(1, 30))))
        elif i % 3 == 1:
            texts.append(
                "root ::= " + " ".join(chooser.choices(ITEMS, k=chooser.randint(0, 12))) + "\nx ::= x"
            )
        else:
            texts.append(f"root ::= {body(0)} x\nx ::= {body(0)}")
    return texts


@pytest.mark.oracle
def test_rules_are_llama_cpp_parser_rules(
    llama_cpp_parser: Path, spm_vocab: LlamaVocab, oracle_report: OracleReport
) -> None:
    texts = [text for text, _ in oracle_cases()] + _random_texts(2000, seed=0)
    ours: list[ParsedGrammar | None] = []
    asked = []
    for text in texts:
        try:
            ours.append(parse_gbnf(text, token_id=_llama_cpp_token_id(spm_vocab)))
        except GrammarError as refused:
            if _reason_key(refused.reason) in _OURS_ONLY:
                continue  # llama.cpp's parser would not return
            ours.append(None)
        asked.append(text)
    theirs = llama_cpp_parse(llama_cpp_parser, Path(spm_vocab.path), asked)
    differ = [text for text, mine, its in zip(asked, ours, theirs, strict=True) if mine != its]
    built = [its is not None for its in theirs]
    for outcome in (True, False):
        total = built.count(outcome)
        wrong = sum(text in differ for text, its in zip(asked, built, strict=True) if its == outcome)
        what = f"rules of texts it {'parses' if outcome else 'refuses'}"
        oracle_report.add(what, "llama-spm", identical=total - wrong, total=total)
    assert 0 < built.count(True) < len(asked)
    assert differ == []
