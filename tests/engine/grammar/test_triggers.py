"""Lazy grammars: trigger patterns as llama.cpp finds them, trigger tokens, the buffer and its replay."""

from __future__ import annotations

import random
import re

import pytest

from constraintd.engine import Grammar, GrammarError, Matcher, Vocab, unpack_mask
from constraintd.engine.chat.params.chat_params import regex_escape
from constraintd.engine.grammar.trigger_regex import Program
from constraintd.engine.grammar.triggers import MAX_LITERAL_BYTES, TriggerPattern, Triggers, literal_of

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


REFUSED = [
    "(",
    "[]",
    "[^]",
    "a\\",
    "\\u0041",
    "a{2,1}",
    "a{",
    "(a)\\1",  # a back-reference: no automaton
    "(?<=a)b",  # lookbehind: std::regex refuses it too
    "(?P<n>a)",
    "a(?=b*)",  # a lookahead of unbounded length
    "a**",
    "*a",
    "(a{1000}){1000}",  # expands past MAX_PROGRAM
]


@pytest.mark.parametrize("pattern", REFUSED, ids=REFUSED)
def test_patterns_refused(pattern: str) -> None:
    with pytest.raises(GrammarError, match="trigger pattern"):
        TriggerPattern.compile(pattern)


def test_patterns_together_are_bounded() -> None:
    with pytest.raises(GrammarError, match="instructions"):
        Triggers.compile(["a{3000}"] * 5, [])


def _translate(pattern: str) -> bytes:
    # the same pattern for Python's `re` (bytes), for these patterns: `.` and `$` as ECMAScript reads them
    return pattern.replace(".", "[^\\n\\r]").replace("$", "\\Z").encode()


def _re_find(regex: re.Pattern[bytes], whole: bool, buffer: bytes) -> int:
    found = regex.fullmatch(buffer) if whole else None
    found = found or regex.search(buffer)
    if found is None:
        return -1
    return next(
        (found.start(g) for g in range(1, regex.groups + 1) if found.end(g) > found.start(g)), found.start()
    )


# patterns where backtracking (Python's `re`, as std::regex) and the automaton must agree, over random text
AGREEING = [
    r"[\s\S]*?(<tool_call>)[\s\S]*",
    r"^\s*(\{)[\s\S]*$",
    r"<\|start\|>assistant(<\|channel\|>(?:commentary|analysis)\s+to)",
    r"^<\|channel\|>(?:commentary|analysis)\s+to=functions$",
    r">>>(?!all)",
    r"a(x?)b",
    r"(a|ab)(c|bcd)(d*)",
    r"(x+x+)+y",
    r"(a*?)(b+)",
    r"\bab\b",
    r"(?:a|b){2,3}?(c)",
    r"^a|b$",
]


@pytest.mark.parametrize("pattern", AGREEING, ids=AGREEING)
def test_the_automaton_finds_what_backtracking_finds(pattern: str) -> None:
    rng = random.Random(pattern)
    compiled = TriggerPattern.compile(pattern)
    regex = re.compile(_translate(pattern))
    alphabet = [b"a", b"b", b"c", b"d", b"x", b"y", b" ", b"\n", b"{", b"<tool_call>", b">>>", b"all", b"to"]
    alphabet += [b"<|start|>assistant", b"<|channel|>", b"commentary", b"=functions"]
    for _ in range(300):
        buffer = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(8)))
        assert compiled.find(buffer) == _re_find(regex, compiled.whole, buffer), buffer


@pytest.mark.parametrize("pattern", AGREEING, ids=AGREEING)
def test_an_incremental_scan_answers_as_a_scan_from_the_start(pattern: str) -> None:
    rng = random.Random(pattern)
    triggers = Triggers.compile([pattern], [])
    for _ in range(100):
        scan, buffer = triggers.start(), b""
        for _ in range(rng.randrange(10)):
            buffer += bytes(rng.choice(b"abcdxy {<>\n") for _ in range(rng.randrange(4)))
            scan, start = triggers.advance(scan, buffer)
            assert start == triggers.advance(triggers.start(), buffer)[1], buffer
            if start >= 0:
                break


def test_a_waiting_accept_costs_the_same_however_long_the_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    # (x+x+)+y backtracks exponentially in the buffer's length (std::regex and Python's `re` alike): the
    # 26th accept of "x" once took 8 s. The automaton reads each new byte once: count its steps.
    steps: list[int] = []
    closure = Program._closure

    def counted(self: Program, *args: object) -> object:
        steps[-1] += 1
        return closure(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Program, "_closure", counted)
    matcher = Matcher(Grammar.from_gbnf(GRAMMAR, VOCAB, trigger_patterns=[r"(x+x+)+y"]))
    for _ in range(500):
        steps.append(0)
        assert matcher.accept(5) and matcher.awaiting_trigger
    assert max(steps) == steps[2] <= 4
    # and a "y" ends the wait, replaying from the start of the first group (llama.cpp's find)
    piece = Vocab([b"</s>", b"x", b"y", b"{"], eog_ids=[0])
    matcher = Matcher(Grammar.from_gbnf('root ::= "x"+ "y" "{"\n', piece, trigger_patterns=[r"(x+x+)+y"]))
    assert all(matcher.accept(1) for _ in range(300)) and matcher.awaiting_trigger
    assert matcher.accept(2) and not matcher.awaiting_trigger and matcher.accept(3) and matcher.is_complete()


LITERALS = [
    # (pattern, the bytes it matches if it is a plain literal)
    ("<function=get_weather>", b"<function=get_weather>"),
    (regex_escape("<|tool_call_begin|>functions.a.b(1)[x]{y}^$?*+\\"),
     b"<|tool_call_begin|>functions.a.b(1)[x]{y}^$?*+\\"),
    (r"a\-b\/c\_", b"a-b/c_"),
    ("caf\u00e9 \n", "caf\u00e9 \n".encode()),
    ("a.b", None),
    (r"\d", None),
    (r"a\nb", None),
    ("^<tool_call>$", None),
    ("a|b", None),
    ("a{2}", None),
    ("a]", None),
    ("", None),
    ("a\\", None),
]


@pytest.mark.parametrize(("pattern", "word"), LITERALS, ids=[p for p, _ in LITERALS])
def test_literal_patterns_are_told_apart(pattern: str, word: bytes | None) -> None:
    assert literal_of(pattern) == word
    if word is not None:  # the program finds it where the literal is
        assert TriggerPattern.compile(pattern).find(b"xy" + word + word) == 2


def _first_match(patterns: list[str], buffer: bytes) -> int:
    # llama_grammar_accept_impl: each pattern in order searched in the whole buffer, each as its own program
    for pattern in patterns:
        start = TriggerPattern.compile(pattern).find(buffer)
        if start >= 0:
            return start
    return -1


def test_literal_and_other_patterns_together_answer_as_each_in_order() -> None:
    # words (one automaton) among regular patterns (programs): the first pattern in order that matches
    # wins, wherever the others match, as when every pattern is its own program
    rng = random.Random(7)
    words = ["<tool_call>", "<function=a>", "<function=ab>", "b>", "<fun", "ab", "a", ">>>x", "(a)"]
    others = [r"[\s\S]*?(<tool_call>)[\s\S]*", r"a(x?)b", r">>>(?!all)", r"^\s*(\{)[\s\S]*$", r"\bab\b"]
    alphabet = [b"a", b"b", b">", b"<", b"x", b" ", b"{", b"(a)", b"<function=", b"<tool_call>", b">>>",
                b"all"]
    for _ in range(400):
        chosen = rng.sample([regex_escape(w) for w in words], rng.randrange(1, 6))
        chosen += rng.sample(others, rng.randrange(3))
        rng.shuffle(chosen)
        triggers = Triggers.compile(chosen, [])
        scan, buffer = triggers.start(), b""
        for _ in range(rng.randrange(1, 8)):
            buffer += b"".join(rng.choice(alphabet) for _ in range(rng.randrange(4)))
            scan, start = triggers.advance(scan, buffer)
            assert start == _first_match(chosen, buffer), (chosen, buffer)
            if start >= 0:
                break


def test_trigger_words_cost_no_program(monkeypatch: pytest.MonkeyPatch) -> None:
    # a thousand tool names are one automaton: no program runs, and none is over MAX_PROGRAM
    triggers = Triggers.compile([regex_escape(f"<function=tool_{i}>") for i in range(1000)], [])
    assert triggers.patterns == ()

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a program ran")

    monkeypatch.setattr(Program, "advance", refuse)
    scan, buffer = triggers.start(), bytearray()
    for piece in (b"Let me ", b"call <func", b"tion=tool_", b"999> now"):
        buffer += piece
        scan, start = triggers.advance(scan, buffer)
    assert start == buffer.index(b"<function=tool_999>")


def test_literal_patterns_together_are_bounded() -> None:
    with pytest.raises(GrammarError, match="literal bytes"):
        Triggers.compile(["x" * 1024 + str(i) for i in range(MAX_LITERAL_BYTES // 1024)], [])


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
