"""The pushdown stacks: the flattened rules, advance_stack, and llama.cpp's accept / apply semantics."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constraintd.engine.grammar import stacks as stacks_module
from constraintd.engine.grammar.elements import CHAR, CHAR_ANY, CHAR_NOT, RULE_REF
from constraintd.engine.grammar.gbnf import GreType, ParsedGrammar, check_grammar, parse_gbnf
from constraintd.engine.grammar.stacks import (
    TAIL_CHUNK,
    Rules,
    Stack,
    StackSet,
    Tail,
    accept_char,
    accept_str,
    accept_token,
    allows_token,
    stack_depth,
)
from constraintd.engine.grammar.utf8 import FRESH
from constraintd.engine.schema.convert import json_schema_to_gbnf
from constraintd.errors import GrammarError
from tests import reference
from tests.grammar_vectors import GrammarCase, Part, read_integration_cases
from tests.strategies import grammars, texts


def compile_rules(text: str) -> tuple[Rules, StackSet]:
    parsed = parse_gbnf(text)
    rules = Rules(parsed)
    return rules, rules.initial_stacks(check_grammar(parsed))


def literal_advance_stack(rules: Rules, stack: Stack) -> set[Stack]:
    # llama_grammar_advance_stack as written in C++: a work list and a `seen` set, rules walked each time
    todo, seen, found = [stack], set(), set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if not current or rules.kinds[current[-1]] != RULE_REF:
            found.add(current)
            continue
        pos = current[-1]
        follow = () if rules.kinds[pos + 1] in (0, 1) else (pos + 1,)
        for start in rules.alternates[rules.values[pos]]:
            todo.append(current[:-1] + follow + (() if start < 0 else (start,)))
    return found


def literal_match(rules: Rules, stacks: StackSet, parts: tuple[Part, ...]) -> bool:
    # test-grammar-integration.cpp's match_string: text as token 0 one code point at a time
    partial = FRESH
    for part in parts:
        pieces = (
            [(part, f"<[{part}]>".encode())] if isinstance(part, int) else [(0, c.encode()) for c in part]
        )
        for token, piece in pieces:
            stacks, partial = accept_token(rules, stacks, partial, token, piece)
            if not stacks:
                return False
    return () in stacks


def test_rules_flatten_the_parsed_rules() -> None:
    parsed = ParsedGrammar(
        symbol_ids={"root": 0, "x": 1},
        rules=(
            ((GreType.RULE_REF, 1), (GreType.CHAR, ord("b")), (GreType.END, 0)),
            (
                (GreType.CHAR, ord("a")),
                (GreType.CHAR_RNG_UPPER, ord("c")),
                (GreType.ALT, 0),
                (GreType.END, 0),
            ),
        ),
    )
    rules = Rules(parsed)
    assert rules.rule_starts == (0, 3)
    assert rules.alternates == ((0,), (3, -1))
    assert rules.classes[3] == (True, ((ord("a"), ord("c")),))
    assert [pos for pos, cls in enumerate(rules.classes) if cls is not None] == [1, 3]
    assert (rules.after[1], rules.after[3]) == (-1, -1)  # the terminals: each ends its alternate
    assert list(rules.next_terminal) == [-1] * len(rules.kinds)
    # root = x "b", x = [a-c] | empty: the root starts at [a-c] (with "b" below) or, x vanishing, at "b"
    assert rules.initial_stacks(0) == {(1, 3), (1,)}


def test_advance_of_a_reference_that_vanishes_uncovers_the_stack_below() -> None:
    rules, initial = compile_rules('root ::= a "x"\na ::= b? c?\nb ::= "b"\nc ::= "c"\n')
    assert {rules.kinds[s[-1]] for s in initial} == {GreType.CHAR}
    assert sorted(chr(rules.values[s[-1]]) for s in initial) == ["b", "c", "x"]


@settings(max_examples=40, deadline=None)
@given(grammars(), st.lists(texts(), max_size=3))
def test_advance_stack_agrees_with_the_literal_algorithm(text: str, inputs: list[str]) -> None:
    try:
        rules, stacks = compile_rules(text)
    except GrammarError:
        return
    for stack in stacks:
        assert set(rules.advance_stack(stack[:-1])) == literal_advance_stack(rules, stack[:-1])
    for sample in inputs:
        current = stacks
        for char in sample:
            for stack in current:
                if stack:
                    below = stack[:-1]
                    assert sorted(rules.advance_stack(below)) == sorted(literal_advance_stack(rules, below))
            current = accept_char(rules, current, ord(char))


def test_left_recursion_llama_cpp_misses_but_survives_is_followed() -> None:
    # `a ::= n b`, n may be empty without an empty alternate, b ::= a | "x": llama.cpp's check misses the
    # left recursion, and its `seen` set ends the search because the stack does not grow
    rules, stacks = compile_rules('root ::= a\na ::= n b\nn ::= m\nm ::= "y" | ""\nb ::= a | "x"\n')
    for char in "yyy":
        stacks = accept_char(rules, stacks, ord(char))
        assert stacks
    assert () in accept_char(rules, stacks, ord("x"))


def test_left_recursion_that_grows_the_stack_is_refused() -> None:
    # llama.cpp's check misses it too, and then never returns from advance_stack
    with pytest.raises(GrammarError, match="left recursion"):
        compile_rules('root ::= n root "b" | "c"\nn ::= m\nm ::= "y" | ""\n')


def fixed_point_nullable(rules: Rules) -> list[bool]:
    # the definition, iterated until nothing changes: a rule is nullable when one of its alternates is
    # made of references to nullable rules only (an empty alternate among them)
    nullable = [False] * len(rules.rule_starts)
    changed = True
    while changed:
        changed = False
        for rule, alternates in enumerate(rules.alternates):
            for start in alternates:
                pos = start
                while pos >= 0 and rules.kinds[pos] == RULE_REF and nullable[rules.values[pos]]:
                    pos += 1
                if not nullable[rule] and (pos < 0 or rules.kinds[pos] in (0, 1)):
                    nullable[rule] = changed = True
    return nullable


CHAINED = 'root ::= "x" a{0,40} "y"\na ::= b? c*\nb ::= "b"? | c\nc ::= [c]\n'


@settings(max_examples=60, deadline=None)
@given(st.one_of(grammars(), st.just(CHAINED)))
def test_closures_met_as_stacks_need_them_are_those_computed_whole(text: str) -> None:
    # without a left cycle, a position's closure is computed when advance_stack first meets it: each is
    # the one the whole computation gives, the cycle test agrees with the search over positions, and the
    # nullable rules are the definition's fixed point
    try:
        check_grammar(parsed := parse_gbnf(text))
        rules = Rules(parsed)
    except GrammarError:
        return
    assert rules._nullable == fixed_point_nullable(rules)
    cyclic = rules._dependency_order()[1]
    assert rules._left_cycle() == cyclic
    whole = rules._compute_closures()
    if cyclic:
        assert rules._closures == whole  # all computed when the rules were built
        return
    assert rules._closures == {}
    refs = [pos for pos, kind in enumerate(rules.kinds) if kind == RULE_REF]
    for pos in reversed(refs):  # top-level positions first: their dependencies are computed with them
        assert rules._close(pos) == whole[pos]
    assert rules._closures == whole
    assert rules.closure_bytes == sum(map(stacks_module._closure_bytes, whole.values()))


def test_a_left_cycle_through_nullable_rules_is_found_when_the_rules_are_built() -> None:
    # llama.cpp's check misses it (n has no empty alternate); the closures are all computed at once
    rules, _ = compile_rules('root ::= a\na ::= n b\nn ::= m\nm ::= "y" | ""\nb ::= a | "x"\n')
    assert rules._left_cycle()
    assert len(rules._closures) == sum(kind == RULE_REF for kind in rules.kinds)


def test_a_schema_grammar_computes_only_the_closures_a_walk_meets() -> None:
    grammar = json_schema_to_gbnf('{"type": "object", "properties": {"a": {"type": "array", "items": '
                                  '{"type": "string"}}, "b": {"type": "number"}}}')
    rules, stacks = compile_rules(grammar)
    refs = sum(kind == RULE_REF for kind in rules.kinds)
    met = len(rules._closures)  # none: the root starts with its brace
    assert literal_match(rules, stacks, ('{"a": ["x"]}',))
    assert met < len(rules._closures) < refs  # the walk met some; the number's were never needed


PARTIAL_CASES = [
    # (class, partial, expected)
    ("[a-z]", (0x3, 1), False),  # é is not a-z
    ("[à-ÿ]", (0x3, 1), True),  # a 2-byte sequence from 0xC3 can be 0xC0-0xFF
    ("[^à-ÿ]", (0x3, 1), False),  # a negated class refuses as soon as a range overlaps
    ("[^a]", (0x3, 1), True),
    ("[a-z]", (0x1, 1), False),  # 0xC1: an overlong form of a 7-bit char
    ("[\\u0800-\\u0fff]", (0x0, 2), True),  # 0xE0 starts 0x800 and above
    ("[\\u0000-\\u07ff]", (0x0, 2), False),
    ("[\\U00010000-\\U0001ffff]", (0x0, 3), True),
    (".", (0x4, 2), True),
    ("[中]", (0x4 << 6 | 0x38, 1), True),
    ("[文]", (0x4 << 6 | 0x38, 1), False),
]


@pytest.mark.parametrize(
    ("klass", "partial", "expected"), PARTIAL_CASES, ids=[f"{c[0]}-{c[1]}" for c in PARTIAL_CASES]
)
def test_match_partial_char(klass: str, partial: tuple[int, int], expected: bool) -> None:
    rules, stacks = compile_rules(f"root ::= {klass}\n")
    (stack,) = stacks
    assert rules.match_partial_char(stack[-1], partial) is expected


def test_apply_and_accept_differ_where_llama_cpp_does() -> None:
    rules, stacks = compile_rules('root ::= "a" "b"\n')
    # an unfinished end that cannot become "b": apply refuses, accept_token keeps the stacks
    assert not allows_token(rules, stacks, 1, b"a\xc3")
    after, partial = accept_token(rules, stacks, FRESH, 1, b"a\xc3")
    assert after and partial == (0x3, 1)
    # invalid UTF-8: apply refuses, accept_token decodes nothing and keeps every stack
    assert not allows_token(rules, stacks, 1, b"\x80")
    assert accept_token(rules, stacks, FRESH, 1, b"\x80")[0] == stacks
    # a token terminal after characters inside one token: apply decides by id, accept_token drops it
    rules, stacks = compile_rules('root ::= "a" <[7]>\n')
    assert allows_token(rules, stacks, 7, b"ab")
    assert not accept_token(rules, stacks, FRESH, 7, b"ab")[0]


def test_accept_str_keeps_a_partial_sequence_for_later() -> None:
    rules, stacks = compile_rules('root ::= "中" "a"\n')
    stacks, partial = accept_str(rules, stacks, FRESH, "中".encode()[:2])
    assert stacks and partial[1] == 1
    stacks, partial = accept_str(rules, stacks, partial, "中".encode()[2:] + b"a")
    assert () in stacks and partial == FRESH


def integration_cases() -> list[GrammarCase]:
    directory = reference.llama_cpp_dir()
    return read_integration_cases(directory) if directory.exists() else []


@pytest.mark.parametrize(
    "case", integration_cases(), ids=lambda case: f"{case.kind}-{case.description or 'unnamed'}"
)
def test_llama_cpp_integration_vectors(case: GrammarCase, llama_cpp_dir: Path) -> None:
    # test_schema cases go through our JSON-schema converter (llama.cpp's, byte for byte) first
    del llama_cpp_dir  # the cases come from it; the fixture fails clearly when it is missing
    rules, stacks = compile_rules(case.text if case.kind == "grammar" else json_schema_to_gbnf(case.text))
    for parts in case.passing:
        assert literal_match(rules, stacks, parts), parts
    for parts in case.failing:
        assert not literal_match(rules, stacks, parts), parts


def test_integration_vectors_are_found(llama_cpp_dir: Path) -> None:
    cases = read_integration_cases(llama_cpp_dir)
    assert len([c for c in cases if c.kind == "grammar"]) >= 14
    assert len([c for c in cases if c.kind == "schema"]) >= 30


# -- deep stacks: bottoms folded into shared tails -------------------------------------------------------

NESTING = r"""
root ::= value
value ::= "[" ws ( value ( "," ws value )* )? "]" ws | "x" ws
ws ::= [ \t]?
"""


def unfolded(stack: Stack) -> Stack:
    """Every position of a stack, its tail's included."""
    if stack and isinstance(stack[0], Tail):
        below = stack[0].unfolded()
        return (*unfolded(below), *stack[1:])
    return stack


def literal_accept_char(rules: Rules, stacks: set[Stack], code_point: int) -> set[Stack]:
    # llama_grammar_accept on whole tuples, nothing folded
    found: set[Stack] = set()
    chars = (CHAR, CHAR_NOT, CHAR_ANY)
    for stack in stacks:
        if stack and rules.kinds[stack[-1]] in chars and rules.match_char(stack[-1], code_point):
            follow = rules.after[stack[-1]]
            found |= literal_advance_stack(rules, stack[:-1] if follow < 0 else (*stack[:-1], follow))
    return found


@settings(max_examples=30, deadline=None)
@given(st.text(alphabet="[],x ", min_size=1, max_size=400).map(lambda s: "[" * 150 + s))
def test_deep_stacks_are_the_literal_stacks_folded(text: str) -> None:
    rules, stacks = compile_rules(NESTING)
    literal = set(stacks)
    for char in text:
        after = accept_char(rules, stacks, ord(char))
        expected = literal_accept_char(rules, literal, ord(char))
        assert {unfolded(stack) for stack in after} == expected
        if not after:
            return
        for stack in after:  # canonical: a tail under TAIL_CHUNK to 2 * TAIL_CHUNK - 1 positions
            if stack and isinstance(stack[0], Tail):
                assert TAIL_CHUNK <= len(stack) - 1 < 2 * TAIL_CHUNK
                assert stack[0].depth % TAIL_CHUNK == 0
                assert stack_depth(stack) == len(unfolded(stack))
            else:
                assert len(stack) < 2 * TAIL_CHUNK
        stacks, literal = after, expected


def test_a_deep_stack_has_one_form_whatever_the_way_to_it() -> None:
    # 300 brackets left open, reached directly and by going 400 deep and closing 100: the same stacks,
    # folded alike (equal, with equal hashes, so a set or a state table finds them the same)
    rules, start = compile_rules(r"""root ::= "(" root ")" | "x" """)

    def take(stacks: StackSet, text: str) -> StackSet:
        for char in text:
            stacks = accept_char(rules, stacks, ord(char))
        return stacks

    direct = take(start, "(" * 300 + "x")
    around = take(start, "(" * 400 + "x" + ")" * 100)
    assert direct == around and hash(direct) == hash(around)
    assert all(isinstance(stack[0], Tail) and len(stack) <= 2 * TAIL_CHUNK for stack in direct)
    assert take(around, ")" * 300) == {()}


def test_pop_terminal_remembers_shallow_stacks_and_gives_what_advancing_gives() -> None:
    rules, initial = compile_rules('root ::= "[" (item ("," item)*)? "]"\nitem ::= [a-c]+ | root')
    stacks: set[Stack] = set(initial)
    for _ in range(40):  # down 20 brackets: deep stacks, folded into tails
        stacks |= accept_char(rules, stacks, ord("["))
    for stack in sorted(stacks, key=len):
        follow = rules.after[stack[-1]]
        expected = rules.advance_stack(stack[:-1] if follow < 0 else (*stack[:-1], follow))
        assert rules.pop_terminal(stack) == tuple(expected)
        assert rules.pop_terminal(stack) == tuple(expected)  # from memory the second time
        assert (stack in rules.popped) == (len(stack) < TAIL_CHUNK)
    assert any(isinstance(stack[0], Tail) for stack in stacks)  # deep ones were met, and not kept


def test_pop_terminal_starts_afresh_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stacks_module, "MAX_POPPED", 2)
    rules, initial = compile_rules('root ::= "a" "b" "c" "d"')
    (stack,) = initial
    for _ in range(4):
        assert len(rules.popped) <= 2
        (stack,) = rules.pop_terminal(stack) or ((),)
        if not stack:
            break
    assert len(rules.popped) <= 2
