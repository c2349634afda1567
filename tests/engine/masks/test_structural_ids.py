"""Structural ids: equal exactly where a token cannot tell two positions apart, and masks stay exact."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constraintd.engine import Grammar, Matcher, Vocab, unpack_mask
from constraintd.engine.grammar.elements import ALT, CHAR, END, RULE_REF
from constraintd.engine.grammar.gbnf import parse_gbnf
from constraintd.engine.grammar.stacks import Rules
from constraintd.engine.masks.compute import compute_mask
from constraintd.engine.masks.structural_ids import ESCAPE_ID, FormTable, Structure

HORIZON = 4  # a vocabulary whose longest token has 3 code points
FORMS = FormTable()  # one vocabulary's table: ids are compared only between structures it numbers


def class_positions(text: str, horizon: int = HORIZON) -> tuple[Structure, list[int]]:
    """The grammar's structure and its char positions whose class is [a-z], in rule order."""
    rules = Rules(parse_gbnf(text))
    structure = Structure(rules, horizon, FORMS)
    found = [
        pos
        for pos, kind in enumerate(rules.kinds)
        if kind == CHAR and rules.values[pos] == ord("a") and rules.values[pos + 1] == ord("z")
    ]
    return structure, found


def first_class_id(text: str, horizon: int = HORIZON) -> int:
    structure, found = class_positions(text, horizon)
    return structure.position(found[0])


def repeated_class_id(text: str) -> int:
    """The id of the first position of the rule the root's first reference names (the repetition)."""
    rules = Rules(parse_gbnf(text))
    root_ref = next(pos for pos, kind in enumerate(rules.kinds) if kind == RULE_REF)
    return Structure(rules, HORIZON, FORMS).position(rules.rule_starts[rules.values[root_ref]])


def test_the_same_rule_in_two_grammars_has_one_id() -> None:
    word = 'word ::= [a-z] [a-z]* "."\n'
    one = first_class_id('root ::= "(" word ")"\n' + word)
    other = first_class_id('root ::= "{" word "," word "}" | "x"\n' + word)
    assert one == other


@pytest.mark.parametrize(
    ("bounded", "same"),
    [("{0,50}", True), ("{0,4}", True), ("{0,3}", False), ("{0,1}", False), ("+", True)],
    ids=["far-past-the-horizon", "at-the-horizon", "inside-the-horizon", "one", "plus"],
)
def test_a_bounded_repetition_is_the_unbounded_one_past_the_horizon(bounded: str, same: bool) -> None:
    # a token of 3 code points cannot tell [a-z]{0,4} from [a-z]* after the first [a-z]: both still take
    # 3 more letters and then look at a fourth; {0,3} refuses that fourth letter
    unbounded = repeated_class_id('root ::= "a" [a-z]* "."\n')
    assert (repeated_class_id(f'root ::= "a" [a-z]{bounded} "."\n') == unbounded) is same


def test_what_follows_within_the_horizon_tells_positions_apart() -> None:
    assert first_class_id('root ::= [a-z] "x"\n') != first_class_id('root ::= [a-z] "y"\n')
    # ...and what follows past it does not
    assert first_class_id('root ::= [a-z] "xyz" "1"\n') == first_class_id('root ::= [a-z] "xyz" "2"\n')
    assert first_class_id('root ::= [a-z] "xyz" "1"\n', horizon=5) != first_class_id(
        'root ::= [a-z] "xyz" "2"\n', horizon=5
    )


def test_the_escape_mark_and_a_stack() -> None:
    structure, found = class_positions('root ::= [a-z] "."\n')
    assert structure.position(structure.rules.escape) == ESCAPE_ID
    assert structure.stack((structure.rules.escape, found[0])) == (ESCAPE_ID, structure.position(found[0]))


def test_a_cycle_that_matches_nothing_is_shared_with_nothing() -> None:
    # r reaches itself through n (empty through m) and s without a terminal: a left recursion llama.cpp's
    # check misses (n has no empty alternate of its own), which its stacks follow once; no finite form
    text = 'root ::= [a-z] r\nr ::= n s | "b"\nn ::= m\nm ::= | "q"\ns ::= r | "c"\n'
    structure, found = class_positions(text)
    again, found_again = class_positions(text)
    assert structure.position(found[0]) != again.position(found_again[0])


# A vocabulary of pieces of 1 to 3 code points over a few letters, so that the horizon is 4.
PIECES = [b"</s>", b"a", b"b", b"ab", b"ba", b"aab", b".", b"a.", b"b.a", b"..", b"x", b"ax", b"\xc3"]
REPEATS = ["{0,1}", "{0,2}", "{0,3}", "{0,4}", "{0,9}", "*", "+", "{2,5}"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(REPEATS), min_size=1, max_size=4),
    st.lists(st.integers(0, 10**6), max_size=8),
)
def test_grammars_sharing_verdicts_give_the_walked_masks(repeats: list[str], choices: list[int]) -> None:
    # several grammars on one vocabulary, in turn: verdicts learned from one are used by the next
    vocab = Vocab(PIECES, eog_ids=[0])
    for repeat in repeats:
        grammar = Grammar.from_gbnf(f'root ::= "a" [ab]{repeat} ("." | "x" [ab]{repeat}) "."?\n', vocab)
        matcher = Matcher(grammar)
        for choice in [*choices, None]:
            mask = matcher.mask()
            state = grammar._states.intern(matcher.stacks, 10**6)
            walked = compute_mask(state, matcher.partial_utf8, grammar._decoded, 10**6)
            assert mask.tolist() == walked.tolist()
            allowed = np.flatnonzero(unpack_mask(mask, len(vocab)))
            if choice is None or allowed.size == 0 or not matcher.accept(int(allowed[choice % allowed.size])):
                break


def test_rules_are_measured_in_terminals_with_cycles_bounded() -> None:
    # at least: exact outside cycles, a lower bound on them; at most: capped at the horizon on a cycle
    parsed = parse_gbnf('root ::= "a" r1 | r2\nr1 ::= [b-c] r1 | ""\nr2 ::= "xy" | "z" r3\nr3 ::= "" | "q"\n')
    structure = Structure(Rules(parsed), 9, FormTable())
    measured = {name: structure.bounds(i) for name, i in parsed.symbol_ids.items()}
    assert measured == {"root": (1, 9), "r1": (0, 9), "r2": (1, 2), "r3": (0, 1)}


def test_a_table_numbers_equal_forms_alike_and_unique_ids_apart() -> None:
    forms = FormTable()
    first = forms.number((1, 2, 3))
    assert forms.number((1, 2, 3)) == first and forms.number((1, 2)) != first
    assert forms.unique() not in {first, forms.number((1, 2))}
    assert len(forms) == 2


def chain_reaches(text: str, horizon: int = 10) -> list[tuple[int, int]]:
    """Per [a-z] position of the grammar, in rule order: (id with chains made loops, reach)."""
    structure, found = class_positions(text, horizon)
    loops = Structure(structure.rules, horizon, FORMS, loops=True)
    return [(ids[0], reach) for ids, reach in (loops.stack_reach((pos,)) for pos in found)]


def test_chain_positions_are_their_loop_below_the_repetitions_left() -> None:
    # the parser writes [a-z]{0,30} as S30 ::= [a-z] S29 | ... S1 ::= [a-z] | (S1 first): the class in
    # S(k) takes up to k letters, the loop any number, so tokens looking at up to k terminals cannot tell
    loop_id, loop_reach = chain_reaches('root ::= "q" [a-z]* "."\n')[0]
    assert loop_reach >= 10  # a real loop reaches no chain: cut at the horizon only
    chain = chain_reaches('root ::= "q" [a-z]{0,30} "."\n')
    assert chain[0][1] >= 10  # S1 ::= [a-z] | : nothing left to tell from a loop
    assert [reach for _, reach in chain[1:]] == [min(k, 10) for k in range(2, 31)]
    assert {found for found, _ in chain[1:]} == {loop_id}
    # the continuation is not the position's: it lies below it on the stack, with ids of its own
    assert chain_reaches('root ::= "q" [a-z]{0,30} "!"\n')[5][0] == loop_id


def test_copies_before_a_chain_or_a_loop_are_the_loop_with_no_way_out() -> None:
    # [a-z]{4,30} is four copies of [a-z], then a chain of 26 links; [a-z]{4,} four copies, then a loop.
    # The j-th copy from the end and the loop over [a-z] with no way out are alike for j terminals.
    bounded = chain_reaches('root ::= "q" [a-z]{4,30} "."\n')[:4]
    unbounded = chain_reaches('root ::= "q" [a-z]{4,} "!"\n')[:4]
    assert [reach for _, reach in bounded] == [reach for _, reach in unbounded] == [4, 3, 2, 1]
    assert len({found for found, _ in bounded + unbounded}) == 1
    # not the loop itself, which may end at once
    assert bounded[0][0] != chain_reaches('root ::= "q" [a-z]* "."\n')[0][0]
    # the loop's own x is no copy before it: it keeps its loop's form, whole
    loop_id, loop_reach = chain_reaches('root ::= "q" [a-z]{4,} "!"\n')[4]
    assert (loop_id, loop_reach) == chain_reaches('root ::= "q" [a-z]* "!"\n')[0]


def test_the_reach_of_a_stack_counts_from_its_top() -> None:
    # the class inside `c` has one terminal before the chain's reference below it
    rules = Rules(parse_gbnf('root ::= "q" c{0,6} "."\nc ::= [a-z] | "-"\n'))
    loops = Structure(rules, 10, FORMS, loops=True)
    top = next(pos for pos, kind in enumerate(rules.kinds) if kind == CHAR and rules.values[pos] == ord("a"))
    # the reference to S(k-1) that ends S(k) ::= c S(k-1) | (after the reference to c), under the class
    below = [
        pos
        for pos, kind in enumerate(rules.kinds)
        if kind == RULE_REF and rules.kinds[pos - 1] == RULE_REF and rules.kinds[pos + 1] in (END, ALT)
    ]
    assert sorted(loops.stack_reach((ref, top))[1] for ref in below) == [2, 3, 4, 5, 6]


def test_a_loop_is_written_once_whichever_rule_repeats_it() -> None:
    # `[a-z]*` in fifty groups is fifty rules of one loop: the positions before them get their ids from
    # the loop's forms, written once per budget (a key trie repeats `char*` in every node), not once per
    # rule and budget
    branches = " | ".join(f'"{chr(ord("A") + i % 26)}" [a-z]*' for i in range(50))
    parsed = parse_gbnf(f"root ::= {branches}\n")
    rules = Rules(parsed)
    horizon = 40
    structure = Structure(rules, horizon, FormTable())
    root = parsed.symbol_ids["root"]
    in_root = range(rules.rule_starts[root], rules.rule_starts[root + 1])
    references = [pos for pos in in_root if rules.kinds[pos] == RULE_REF]
    assert len(references) == 50
    assert len({structure.position(pos) for pos in references}) == 1
    assert len({structure.position(pos - 1) for pos in references}) == 26  # the letter before tells apart
    assert len(structure._rule_ids) < 10  # the class's forms; no chain of forms per rule
    assert len(structure._loop_ids) <= horizon + 1


VALUE_RULES = (
    'value ::= object | array | "n" | [0-9] [0-9]*\n'
    'object ::= "{" ( [a-z] ":" value ( "," [a-z] ":" value )* )? "}"\n'
    'array ::= "[" ( value ( "," value )* )? "]"\n'
)


@pytest.mark.parametrize("loops", [False, True], ids=["forms", "loops"])
def test_a_recursive_rule_is_written_once_per_table_whatever_grammar_repeats_it(loops: bool) -> None:
    # `value`, `object` and `array` (every schema with a free-form value repeats them, under other rule
    # ids) have a form for each budget up to the horizon: a second grammar takes them from the table,
    # with the ids the first one wrote, instead of writing them again
    horizon = 24
    forms = FormTable()
    texts = (
        'root ::= "a" value "."\n' + VALUE_RULES,
        'root ::= "b" key value "!"\nkey ::= [a-z]\n' + VALUE_RULES,
    )
    written: list[dict[tuple[str, int], tuple[int, int]]] = []
    sequences: list[int] = []
    sequence = Structure._sequence
    for text in texts:
        parsed = parse_gbnf(text)
        rules = Rules(parsed)
        structure = Structure(rules, horizon, forms, loops=loops)
        names = {parsed.symbol_ids[name]: name for name in ("value", "object", "array")}
        starts = rules.rule_starts
        inside = {pos for rule in names for pos in range(starts[rule], starts[rule + 1])}
        started: list[int] = []

        def spy(
            self: Structure, start: int, budget: int, loop: object = None, started: list[int] = started
        ) -> object:
            started.append(start)
            return sequence(self, start, budget, loop)  # type: ignore[arg-type]

        value = parsed.symbol_ids["value"]
        before = next(
            pos for pos, kind in enumerate(rules.kinds) if kind == RULE_REF and rules.values[pos] == value
        )
        with mock.patch.object(Structure, "_sequence", spy):
            structure.position(before)
        sequences.append(sum(start in inside for start in started))
        own = structure._rule_ids.items()
        written.append({(names[rule], budget): found for (rule, budget), found in own if rule in names})
    assert sequences[0] > 0 and sequences[1] == 0
    shared = written[0].keys() & written[1].keys()
    assert shared and all(written[0][key] == written[1][key] for key in shared)


def test_rules_with_equal_closures_share_a_signature_and_unequal_ones_do_not() -> None:
    forms = FormTable()
    parsed = parse_gbnf('root ::= a b c\na ::= "x" a | "y"\nb ::= "x" b | "y"\nc ::= "x" c | "z"\n')
    rules = Rules(parsed)
    structure = Structure(rules, 8, forms)
    a, b, c = (structure._signature(parsed.symbol_ids[name]) for name in "abc")
    assert a is not None and a == b
    assert c is not None and c != a
    other = Structure(Rules(parse_gbnf('root ::= "q" d\nd ::= "x" d | "y"\n')), 8, forms)
    assert other._signature(1) == a  # rule d, under another id in another grammar
