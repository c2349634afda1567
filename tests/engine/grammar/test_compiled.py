"""The compiled grammar: what it refuses, its key, and that it is shared and immutable."""

from __future__ import annotations

import pytest

from constraintd.engine import Grammar, GrammarError, Matcher, Vocab
from constraintd.engine.grammar.gbnf import parse_gbnf
from tests.engine.grammar.collector import collector_off

VOCAB = Vocab([b"</s>", b"a", b"b", b"ab"], eog_ids=[0])
OTHER_VOCAB = Vocab([b"</s>", b"a", b"b", b"ba"], eog_ids=[0])


def test_from_gbnf() -> None:
    grammar = Grammar.from_gbnf('root ::= "a" x\nx ::= "b"\n', VOCAB)
    assert grammar.root == "root" and grammar._root_id == 0
    assert not grammar.lazy
    assert grammar.n_vocab == 4
    assert grammar.parsed == parse_gbnf('root ::= "a" x\nx ::= "b"\n')


def test_another_root() -> None:
    grammar = Grammar.from_gbnf('root ::= "a"\nx ::= "b"\n', VOCAB, root="x")
    matcher = Matcher(grammar)
    assert not matcher.allows(1) and matcher.allows(2)


@pytest.mark.parametrize(
    ("text", "root", "reason"),
    [
        ('root ::= "a', "root", "unexpected end of input"),
        ('root ::= "a"\n', "start", "'start'"),
        ('root ::= root "a"\n', "root", "left recursion"),
        ("root ::= x\n", "root", "x"),
    ],
    ids=["parse", "no-root", "left-recursion", "undefined"],
)
def test_refused(text: str, root: str, reason: str) -> None:
    with pytest.raises(GrammarError, match=reason):
        Grammar.from_gbnf(text, VOCAB, root=root)


def test_a_parse_error_says_where() -> None:
    with pytest.raises(GrammarError) as error:
        Grammar.from_gbnf('root ::= "a"\nx ::= "b" @\n', VOCAB)
    assert error.value.line == 2


def test_a_bad_trigger_pattern_is_a_grammar_error() -> None:
    with pytest.raises(GrammarError, match="trigger pattern"):
        Grammar.from_gbnf('root ::= "a"\n', VOCAB, trigger_patterns=["("])


def test_key_covers_text_root_triggers_and_vocabulary() -> None:
    text = 'root ::= "a"\nx ::= "b"\n'
    key = Grammar.from_gbnf(text, VOCAB).key
    assert Grammar.from_gbnf(text, VOCAB).key == key
    assert len(key) == 64
    others = [
        Grammar.from_gbnf(text + "\n", VOCAB),
        Grammar.from_gbnf(text, VOCAB, root="x"),
        Grammar.from_gbnf(text, VOCAB, trigger_tokens=[1]),
        Grammar.from_gbnf(text, VOCAB, trigger_patterns=["a"]),
        Grammar.from_gbnf(text, OTHER_VOCAB),
    ]
    assert len({key, *(g.key for g in others)}) == 6
    assert all(g.lazy for g in others[2:4])


def test_matchers_share_the_grammar_and_do_not_disturb_each_other() -> None:
    grammar = Grammar.from_gbnf('root ::= "a" "b" | "b" "a"\n', VOCAB)
    first, second = Matcher(grammar), Matcher(grammar)
    assert first.accept(1) and second.accept(2)
    assert first.allows(2) and not first.allows(1)
    assert second.allows(1) and not second.allows(2)


def test_a_dropped_grammar_frees_its_states_without_the_cyclic_collector() -> None:
    # a loop in the grammar is a cycle between its states' memos; the grammar breaks them when it goes
    with collector_off() as states:
        before = states()
        grammar = Grammar.from_gbnf('root ::= ("a" | "b" | "ab")* "b"\n', VOCAB)
        matcher = Matcher(grammar)
        for token in [1, 2, 3, 1, 1, 3]:
            matcher.mask()
            assert matcher.accept(token)
        kept = grammar._states
        assert len(kept) > 1 and states() > before
        del grammar, matcher
        assert states() == before
        assert len(kept) == 0  # what is left of the table holds nothing
