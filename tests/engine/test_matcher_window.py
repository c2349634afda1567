"""Matcher's rollback window (`max_rollback`): the last W steps kept, the oldest dropped in chunks, a rollback
past them refused; everything inside the window is exactly what an unlimited matcher does."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine import matcher as matcher_module
from constraintd.errors import InputError

BYTES = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])
LETTERS = Grammar.from_gbnf("root ::= [a-z]*\n", BYTES)
# a lazy grammar: free text until "<t>" (a pattern), then digits; or at once after the token "#"
LAZY = Grammar.from_gbnf(
    'root ::= ("<t>" | "#") [0-9]*\n', BYTES, trigger_patterns=["<t>"], trigger_tokens=[ord("#")]
)
# a pattern that matches the whole buffer: the replay starts at its first byte, however long it grew
WHOLE = Grammar.from_gbnf('root ::= "a" [a-z]* "!" [0-9]*\n', BYTES, trigger_patterns=["^a[a-z]*!$"])


def tokens(text: str) -> list[int]:
    return list(text.encode())


def state(matcher: Matcher) -> tuple[object, ...]:
    """What a matcher is, as its answers show it (the history aside: a window keeps part of it)."""
    return (
        matcher.stacks,
        matcher.partial_utf8,
        matcher.awaiting_trigger,
        matcher.is_complete(),
        matcher.mask().tobytes(),
        matcher.position,
    )


@pytest.fixture
def small_slack(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # trims every few steps, and keeps a waiting grammar's scan every few tokens, so a short test crosses
    # many of both
    monkeypatch.setattr(matcher_module, "ROLLBACK_SLACK", 2)
    monkeypatch.setattr(matcher_module, "SCAN_EVERY", 2)
    yield


def test_the_window_keeps_the_last_steps_and_refuses_a_rollback_past_them() -> None:
    windowed, unlimited = Matcher(LETTERS, max_rollback=4), Matcher(LETTERS)
    for token in tokens("abcdefghij"):
        assert windowed.accept(token) and unlimited.accept(token)
    assert windowed.history == tuple(tokens("ghij"))
    assert windowed.position == unlimited.position == 10
    with pytest.raises(InputError, match=r"cannot roll back 5 steps: the rollback window \(max_rollback\)"):
        windowed.rollback(5)
    assert state(windowed) == state(unlimited)  # a refused rollback changes nothing
    with pytest.raises(InputError, match="11 steps: 10 were taken"):
        windowed.rollback(11)
    windowed.rollback(4)
    unlimited.rollback(4)
    assert state(windowed) == state(unlimited)
    assert windowed.history == () and windowed.position == 6


def test_rollbacks_use_the_window_up_as_a_bounded_history_does(small_slack: None) -> None:
    # XGrammar's max_rollback_tokens: a step pushes one in, a rollback takes them out; the slack the trail
    # holds before a trim never lets a rollback reach further
    for taken in range(6, 40):
        matcher = Matcher(LETTERS, max_rollback=5)
        for _ in range(taken):
            matcher.accept(ord("a"))
        matcher.rollback(3)
        matcher.accept(ord("b"))
        assert matcher.history == (ord("a"), ord("a"), ord("b"))
        with pytest.raises(InputError, match="keeps the last 5 steps, and 3 are left"):
            matcher.rollback(4)
        matcher.rollback(3)
        assert matcher.position == taken - 5 and not matcher.history


def test_the_trail_is_trimmed_in_chunks_and_never_holds_more_than_the_window_and_its_slack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    window, steps = 1000, 100_000
    slack = max(window // 4, matcher_module.ROLLBACK_SLACK)
    trims = []
    trim = Matcher._trim

    def counted(matcher: Matcher) -> None:
        trims.append(len(matcher._trail_tokens))
        trim(matcher)
        assert len(matcher._trail_tokens) == window

    monkeypatch.setattr(Matcher, "_trim", counted)
    matcher = Matcher(LETTERS, max_rollback=window)
    longest = 0
    for _ in range(steps):
        matcher.accept(ord("a"))
        longest = max(longest, len(matcher._trail_tokens))
    assert longest == window + slack
    # amortized: one trim every `slack + 1` steps, each moving the window's `window` entries
    assert trims == [window + slack + 1] * ((steps - window) // (slack + 1))
    assert matcher.position == steps and len(matcher.history) == window


def test_a_window_of_none_remembers_every_step_and_zero_none() -> None:
    unlimited, nothing = Matcher(LETTERS), Matcher(LETTERS, max_rollback=0)
    for token in tokens("abc" * 200):
        unlimited.accept(token)
        nothing.accept(token)
    assert len(unlimited.history) == unlimited.position == nothing.position == 600
    assert nothing.history == () and len(nothing._trail_tokens) <= matcher_module.ROLLBACK_SLACK
    nothing.rollback(0)
    with pytest.raises(InputError, match="keeps the last 0 steps"):
        nothing.rollback(1)
    unlimited.rollback(600)
    assert unlimited.position == 0
    with pytest.raises(ValueError, match="-1"):
        Matcher(LETTERS, max_rollback=-1)


def test_a_prefill_is_a_step_of_the_window_but_not_a_token() -> None:
    matcher = Matcher(LETTERS, max_rollback=3)
    assert matcher.accept_bytes(b"xyz")
    for token in tokens("ab"):
        matcher.accept(token)
    assert matcher.history == tuple(tokens("ab")) and matcher.position == 2
    matcher.accept(ord("c"))  # the prefill's step leaves the window
    assert matcher.history == tuple(tokens("abc")) and matcher.position == 3
    with pytest.raises(InputError, match="rollback window"):
        matcher.rollback(4)


def test_fork_keeps_the_window(small_slack: None) -> None:
    matcher = Matcher(LETTERS, max_rollback=4)
    for token in tokens("abcdefgh"):
        matcher.accept(token)
    twin = matcher.fork()
    assert twin.max_rollback == 4 and twin.history == matcher.history and twin.position == 8
    for token in tokens("ijklmnop"):
        twin.accept(token)
    assert twin.history == tuple(tokens("mnop")) and twin.position == 16
    assert matcher.history == tuple(tokens("efgh")) and matcher.position == 8
    with pytest.raises(InputError, match="rollback window"):
        twin.rollback(5)
    twin.rollback(4)
    for token in tokens("ijkl"):
        matcher.accept(token)
    assert state(twin) == state(matcher)


def test_a_trigger_inside_the_window_rolls_back_to_the_wait(small_slack: None) -> None:
    windowed, unlimited = Matcher(LAZY, max_rollback=8), Matcher(LAZY)
    text = tokens("free text, long before the trigger " * 5 + "<t>12")
    for token in text:
        assert windowed.accept(token) and unlimited.accept(token)
    assert not windowed.awaiting_trigger
    windowed.rollback(3)  # to just before ">": waiting again
    unlimited.rollback(3)
    assert windowed.awaiting_trigger and state(windowed) == state(unlimited)
    for token in tokens(">3"):  # the trigger again, from the scans the window kept
        assert windowed.accept(token) and unlimited.accept(token)
    assert not windowed.awaiting_trigger and state(windowed) == state(unlimited)
    assert len(windowed._scans) <= (8 + 2 + 1) // 2 + 2 < len(unlimited._scans)
    windowed.rollback(5)  # to before "<": the pattern's search goes back to where it stood then
    unlimited.rollback(5)
    for token in tokens("t>"):
        assert windowed.accept(token) and unlimited.accept(token)
    assert windowed.awaiting_trigger and state(windowed) == state(unlimited)


def test_a_trigger_outside_the_window_stays_pulled(small_slack: None) -> None:
    windowed, unlimited = Matcher(LAZY, max_rollback=3), Matcher(LAZY)
    for token in [*tokens("xyz"), ord("#"), *tokens("1234567")]:
        assert windowed.accept(token) and unlimited.accept(token)
    with pytest.raises(InputError, match="rollback window"):
        windowed.rollback(8)  # to the wait: past the window
    windowed.rollback(3)
    unlimited.rollback(3)
    assert not windowed.awaiting_trigger and state(windowed) == state(unlimited)


def test_a_pattern_matching_the_whole_buffer_replays_it_all_past_the_window() -> None:
    # the buffer of a waiting grammar is not the trail: it stays whole, so a match that starts at its
    # first byte replays every token, however few steps the window keeps
    windowed, unlimited = Matcher(WHOLE, max_rollback=2), Matcher(WHOLE)
    for token in tokens("a" + "b" * 2000 + "!"):
        assert windowed.accept(token) and unlimited.accept(token)
    assert not windowed.awaiting_trigger and state(windowed) == state(unlimited)
    assert windowed.accept(ord("7")) and unlimited.accept(ord("7")) and not windowed.allows(ord("b"))
    windowed.rollback(2)
    unlimited.rollback(1)
    unlimited.rollback(1)
    assert windowed.awaiting_trigger and state(windowed) == state(unlimited)


def held_after(steps: int, make: Callable[[], Matcher], token: int) -> int:
    """Bytes a matcher made by `make` holds after accepting `token` `steps` times (Python's allocations)."""
    tracemalloc.start()
    try:
        matcher = make()
        for _ in range(steps):
            assert matcher.accept(token)
        held: int = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert matcher.position == steps
    return held


def test_a_matcher_holds_its_window_whatever_it_accepts() -> None:
    # a trail step is about 20 bytes: 100,000 steps held 2 MB; a window of 64 holds at most 320 steps
    held = held_after(100_000, lambda: Matcher(LETTERS, max_rollback=64), ord("a"))
    assert held < 64 * 1024, f"{held} bytes"


def test_a_waiting_lazy_grammar_holds_its_buffer_and_12_bytes_a_token_past_its_window() -> None:
    # The buffer is the text llama.cpp keeps too (a pattern may match from its first byte); each token
    # waiting adds its piece and 12 bytes (its id and its piece's end), and a step of the window its
    # context, about 100 bytes (the patterns' scan, up to a kilobyte, is kept every SCAN_EVERY tokens
    # only: kept after each, it made 350 bytes to a kilobyte a step). It was about 490 bytes a token.
    steps, window = 20_000, 64
    held = held_after(steps, lambda: Matcher(LAZY, max_rollback=window), ord("a"))
    per_token = 1 + 12
    window_bound = (window + matcher_module.ROLLBACK_SLACK) * 128
    assert held < steps * per_token * 1.25 + window_bound, f"{held / steps:.1f} bytes a token"


def test_reset_starts_again_with_the_whole_window() -> None:
    matcher = Matcher(LAZY, max_rollback=2)
    for token in tokens("abcdef<t>1"):
        matcher.accept(token)
    matcher.reset()
    fresh = Matcher(LAZY, max_rollback=2)
    assert state(matcher) == state(fresh) and matcher.history == ()
    for token in tokens("ab"):
        matcher.accept(token)
    matcher.rollback(2)
    assert state(matcher) == state(fresh)


# An operation on both matchers: accept a token of the text's alphabet, take some bytes, roll back, fork.
OPERATIONS = st.one_of(
    st.tuples(st.just("accept"), st.sampled_from(tokens("ab<t>#19!"))),
    st.tuples(st.just("bytes"), st.sampled_from([b"ab", b"1", b"<", b"t>"])),
    st.tuples(st.just("rollback"), st.integers(0, 8)),
    st.tuples(st.just("fork"), st.just(0)),
)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from([LETTERS, LAZY, WHOLE]),
    st.integers(0, 6),
    st.lists(OPERATIONS, max_size=60),
    st.sampled_from([1, 2, 3, 64]),
)
def test_inside_the_window_a_matcher_is_an_unlimited_one(
    grammar: Grammar, window: int, operations: list[tuple[str, object]], scan_every: int
) -> None:
    # the model of the window: how many steps a rollback may undo (a bounded history's length)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matcher_module, "ROLLBACK_SLACK", 1)
        windowed, unlimited = Matcher(grammar, max_rollback=window), Matcher(grammar)
        # a waiting grammar's scan kept every `scan_every` tokens: the rest are taken again at a rollback
        patch.setattr(matcher_module, "SCAN_EVERY", scan_every)
        check_operations(grammar, window, windowed, unlimited, operations)


def check_operations(
    grammar: Grammar, window: int, windowed: Matcher, unlimited: Matcher, operations: list[tuple[str, object]]
) -> None:
    reach = 0
    for name, argument in operations:
        if name == "accept":
            assert isinstance(argument, int)
            taken = unlimited.accept(argument)
            assert windowed.accept(argument) == taken
            reach = min(reach + taken, window)
        elif name == "bytes":
            assert isinstance(argument, bytes)
            taken = unlimited.accept_bytes(argument)
            assert windowed.accept_bytes(argument) == taken
            reach = min(reach + taken, window)
        elif name == "rollback":
            assert isinstance(argument, int)
            if argument <= reach:
                windowed.rollback(argument)
                unlimited.rollback(argument)
                reach -= argument
            else:
                with pytest.raises(InputError):
                    windowed.rollback(argument)
        else:
            windowed, unlimited = windowed.fork(), unlimited.fork()
        assert state(windowed) == state(unlimited)
        steps = unlimited._trail_tokens
        assert windowed.history == tuple(token for token in steps[len(steps) - reach :] if token != -1)
        assert len(windowed._trail_tokens) <= window + max(window // 4, 1)
        for matcher in (windowed, unlimited):
            if matcher.awaiting_trigger:  # its scan is where a search over its whole buffer stands
                triggers = grammar._triggers
                assert matcher._scan == triggers.advance(triggers.start(), matcher._buffer)[0]
