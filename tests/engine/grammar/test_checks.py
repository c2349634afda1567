"""check_grammar (llama_grammar_init_impl's checks) and format_gbnf (llama.cpp's print_grammar).

llama.cpp deciding the same grammars is in test_gbnf.py's oracle tests, which build these cases too.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from constraintd.engine import Grammar, Vocab
from constraintd.engine.grammar import checks
from constraintd.engine.grammar.gbnf import (
    ERRORS,
    GreType,
    ParsedGrammar,
    check_grammar,
    format_gbnf,
    parse_gbnf,
)
from constraintd.engine.grammar.stacks import Rules
from constraintd.engine.schema.convert import json_schema_to_gbnf
from constraintd.errors import GrammarError
from tests.strategies import grammars

BYTES = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])

# (message key, grammar, root, message fields): refused by check_grammar, at no one spot.
CHECK_REFUSALS: list[tuple[str, str, str, dict[str, object]]] = [
    ("no_rules", "", "root", {}),
    ("no_rules", "  # only a comment\r\n\n", "root", {}),
    ("no_root", 'rot ::= "a"', "root", {"root": "root"}),
    ("no_root", 'root ::= "a"', "Root", {"root": "Root"}),
    ("no_root", 'root ::= b\nroot ::= "a"', "b", {"root": "b"}),  # `b` is a name without a rule
    ("left_recursion", "root ::= root", "root", {"index": 0}),
    ("left_recursion", 'root ::= "" root', "root", {"index": 0}),
    ("left_recursion", 'a ::= "x"\nroot ::= b\nb ::= c\nc ::= b "y"', "root", {"index": 1}),
    ("left_recursion", 'root ::= e* root "x"\ne ::= "e"', "root", {"index": 0}),
    ("left_recursion", 'root ::= ("x" | ) root', "root", {"index": 0}),
]


@pytest.mark.parametrize(
    ("key", "text", "root", "fields"),
    CHECK_REFUSALS,
    ids=[f"{case[0]}{i}" for i, case in enumerate(CHECK_REFUSALS)],
)
def test_check_refusal_reason(key: str, text: str, root: str, fields: dict[str, object]) -> None:
    parsed = parse_gbnf(text)
    with pytest.raises(GrammarError) as refused:
        check_grammar(parsed, root)
    assert (refused.value.reason, refused.value.line) == (ERRORS[key].format(**fields), 0)


LEFT_RECURSIONS = [case for case in CHECK_REFUSALS if case[0] == "left_recursion"]


@pytest.mark.parametrize(("key", "text", "root", "fields"), LEFT_RECURSIONS)
def test_the_rules_refuse_left_recursion_as_the_check_does(key: str, text: str, root: str,
                                                          fields: dict[str, object]) -> None:
    # Grammar leaves this check to the rules, which make it where their own left cycles are
    parsed = parse_gbnf(text)
    assert check_grammar(parsed, root, left_recursion=False) == parsed.symbol_ids[root]
    with pytest.raises(GrammarError) as refused:
        Rules(parsed)
    assert refused.value.reason == ERRORS[key].format(**fields)
    with pytest.raises(GrammarError) as refused:
        Grammar.from_gbnf(text, BYTES, root=root)
    assert refused.value.reason == ERRORS[key].format(**fields)


def test_a_grammar_without_left_cycles_is_not_searched_again(monkeypatch: pytest.MonkeyPatch) -> None:
    def searched(rules: object) -> None:
        raise AssertionError("llama.cpp's left-recursion search ran")

    monkeypatch.setattr(checks, "_left_recursive_rule", searched)
    schema = '{"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}}}}'
    for dialect in ("llama.cpp", "extended"):
        Grammar.from_gbnf(json_schema_to_gbnf(schema, dialect=dialect), BYTES)
    with pytest.raises(AssertionError, match="search ran"):
        Grammar.from_gbnf("root ::= x root | \"a\"\nx ::= y\ny ::= | \"b\"", BYTES)


def test_left_recursion_seen_only_through_rules_with_an_empty_alternate() -> None:
    # llama.cpp looks through a rule that has an empty alternate, not through one that is only
    # nullable by way of other rules; so it does not refuse this grammar (it cannot run it either).
    text = 'root ::= x root "c" | "a"\nx ::= y\ny ::= "" | "b"'
    assert check_grammar(parse_gbnf(text)) == 0
    with pytest.raises(GrammarError):
        check_grammar(parse_gbnf('root ::= x root "c" | "a"\nx ::= "" | "b"'))


@pytest.mark.parametrize(
    ("key", "rules", "fields"),
    [
        ("malformed", ((),), {"rule": 0}),
        ("malformed", (((GreType.CHAR, 97),),), {"rule": 0}),
        ("end_inside", (((GreType.END, 0), (GreType.END, 0)),), {"rule": 0, "index": 0}),
        (
            "char_modifier",
            (((GreType.CHAR_ALT, 97), (GreType.END, 0)),),
            {"kind": "CHAR_ALT", "rule": 0, "index": 0},
        ),
        (
            "char_modifier",
            (((GreType.RULE_REF, 0), (GreType.CHAR_RNG_UPPER, 97), (GreType.END, 0)),),
            {"kind": "CHAR_RNG_UPPER", "rule": 0, "index": 1},
        ),
        ("bad_reference", (((GreType.RULE_REF, 1), (GreType.END, 0)),), {"rule": 0, "ref": 1}),
        ("unknown_element", (((10, 0), (GreType.END, 0)),), {"kind": 10, "rule": 0, "index": 0}),
    ],
    ids=["empty", "no-end", "end-inside", "alt-first", "range-after-ref", "undefined-ref", "unknown-type"],
)
def test_check_refuses_malformed_hand_built_grammars(
    key: str, rules: tuple[tuple[tuple[int, int], ...], ...], fields: dict[str, object]
) -> None:
    with pytest.raises(GrammarError) as refused:
        check_grammar(ParsedGrammar(symbol_ids={"root": 0}, rules=rules))
    assert refused.value.reason == ERRORS[key].format(**fields)


@settings(max_examples=60, deadline=None)
@given(grammars())
def test_the_parsers_grammars_are_well_formed_by_construction(text: str) -> None:
    # what lets check_grammar skip their shape: every grammar the parser makes passes the shape check
    parsed = parse_gbnf(text)
    assert parsed.well_formed
    checks._check_shape(parsed.rules)
    assert not ParsedGrammar(symbol_ids=parsed.symbol_ids, rules=parsed.rules).well_formed


def test_left_recursion_search_finishes_each_rule_once() -> None:
    # llama.cpp walks both alternates of every rule of this chain again and again (2**10,000 steps);
    # the answer is the same without that: no left recursion.
    chain = "".join(f"r{i} ::= r{i + 1} | r{i + 1} \n" for i in range(10_000)) + 'r10000 ::= "z"\nroot ::= r0'
    assert check_grammar(parse_gbnf(chain)) == 10_001
    with pytest.raises(GrammarError) as refused:
        check_grammar(parse_gbnf(chain.replace('"z"', "r0")))
    assert refused.value.reason == ERRORS["left_recursion"].format(index=0)


def test_format_gbnf_is_llama_cpp_print_grammar() -> None:
    parsed = parse_gbnf('root ::= ("a" | [^b-d\\n] .)* <[7]> !<[8]> x\nx ::= [é]')
    assert format_gbnf(parsed) == (
        "root ::= root_2 <[7]> !<[8]> x \n"
        "root_1 ::= [a] | [^b-d<U+000A>.] \n"  # llama.cpp closes a class only before a non-char
        "root_2 ::= root_1 root_2 | \n"
        "x ::= [<U+00E9>] \n"
    )
