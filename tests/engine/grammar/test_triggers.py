"""Lazy grammars: trigger patterns as llama.cpp finds them, trigger tokens, the buffer and its replay."""

from __future__ import annotations

import pytest

from constraintd.engine import Grammar, GrammarError, Matcher, Vocab, unpack_mask
from constraintd.engine.grammar.triggers import TriggerPattern, Triggers

FIND_CASES = [
    # (pattern, buffer, start)
    (r"[\s\S]*?(<tool_call>)[\s\S]*", b"hi <tool_call>{", 3),
    (r"<tool_call>", b"hi <tool_call>{", 3),
    (r"<tool_call>", b"hi <tool", -1),
    # no group matched something: the whole match's start
    (r"a(x?)b", b"..ab", 2),
    (r"a(x?)b", b"..axb", 3),
    # ^...$ is first matched against the whole buffer
    (r"^(.*)$", b"abc", 0),
    (r"^\s*(\{)[\s\S]*$", b"  {x", 2),
    # `.` does not match \r or \n in ECMAScript
    (r"^a.c$", b"a\rc", -1),
    (r"a.c", b"a\nc", -1),
    (r"a.c", b"abc", 0),
    # `$` matches only at the very end (Python's also matches before a final newline)
    (r"a$", b"a\n", -1),
    (r"a$", b"xa", 1),
    # a ^...$ pattern that is an alternation: the whole-buffer match fails, the search finds "b"
    (r"^a|b$", b"xb", 1),
    # classes are read as in ECMAScript; characters Python would warn about are escaped
    (r"[[]x", b"a[x", 1),
    (r"[a&&b]", b"&", 0),
    (r"[^\n]+", b"\nab", 1),
]


@pytest.mark.parametrize(
    ("pattern", "buffer", "start"), FIND_CASES, ids=[f"{c[0]}-{c[1]!r}" for c in FIND_CASES]
)
def test_find(pattern: str, buffer: bytes, start: int) -> None:
    assert TriggerPattern.compile(pattern).find(buffer) == start


@pytest.mark.parametrize("pattern", ["(", "[]", "[^]", "a\\", "\\u0041", "a{2,1}"])
def test_patterns_refused(pattern: str) -> None:
    with pytest.raises(GrammarError):
        TriggerPattern.compile(pattern)


def test_replay_cuts_the_first_token_at_the_match_start() -> None:
    triggers = Triggers.compile([r"[\s\S]*?(\{)"], [])
    buffered = [(5, 0, 3), (6, 3, 6), (7, 6, 8)]
    assert triggers.replay(b"abcde{gh", buffered) == [(6, b"{"), (7, b"gh")]
    assert triggers.replay(b"abcdefgh", buffered) is None


VOCAB = Vocab([b"</s>", b"hello ", b"<tool>", b'{"a', b'":1}', b"x", b" {", b"\x80"], eog_ids=[0])
GRAMMAR = 'root ::= "{" [^}]* "}"\n'


def test_a_lazy_grammar_allows_everything_until_a_pattern_matches() -> None:
    matcher = Matcher(Grammar.from_gbnf(GRAMMAR, VOCAB, trigger_patterns=[r"[\s\S]*?(\{)[\s\S]*"]))
    assert matcher.awaiting_trigger and matcher.is_complete()
    assert unpack_mask(matcher.mask(), len(VOCAB)).all()
    assert matcher.accept(1) and matcher.accept(7) and matcher.accept(0)  # anything, even invalid UTF-8
    assert matcher.accept(6)  # " {": the match starts at "{", which is replayed
    assert not matcher.awaiting_trigger
    assert unpack_mask(matcher.mask(), len(VOCAB)).tolist() == [
        False,
        True,
        True,
        True,
        True,
        True,
        True,
        False,
    ]
    assert matcher.accept(4)
    assert matcher.is_complete()
    matcher.rollback(2)
    assert matcher.awaiting_trigger
    assert matcher.accept(6) and not matcher.awaiting_trigger


def test_a_trigger_token_is_accepted_by_the_grammar() -> None:
    grammar = Grammar.from_gbnf('root ::= <[2]> "{" [^}]* "}"\n', VOCAB, trigger_tokens=[2])
    matcher = Matcher(grammar)
    assert matcher.accept(5) and matcher.awaiting_trigger
    assert matcher.accept(2) and not matcher.awaiting_trigger
    assert matcher.accept(3) and matcher.accept(4) and matcher.is_complete()


def test_a_trigger_the_grammar_refuses_is_rejected_and_changes_nothing() -> None:
    # llama.cpp throws (and aborts) when the replayed text does not fit the grammar
    grammar = Grammar.from_gbnf(
        'root ::= "[" [0-9]* "]"\n', VOCAB, trigger_patterns=[r"\{"], trigger_tokens=[2]
    )
    matcher = Matcher(grammar)
    assert matcher.accept(1)
    assert not matcher.accept(6)
    assert not matcher.accept(2)
    assert matcher.awaiting_trigger and matcher.history == (1,)
