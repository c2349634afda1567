"""Lookahead: a grammar's first verdicts learnt before its masks ask, the same masks afterwards."""

from __future__ import annotations

import contextlib
import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constraintd.engine import Grammar, LimitError, Matcher, Vocab, json_object_grammar, unpack_mask
from constraintd.engine.masks.ahead import AheadRun
from constraintd.engine.masks.compute import Interruption, check_deadline, compute_allowed
from constraintd.engine.schema.convert import json_schema_to_gbnf
from constraintd.errors import DeadlineError
from tests.strategies import compile_or_skip, grammars, vocabs

PIECES = [b"</s>", b"{", b"}", b'"', b'{"', b'":', b" ", b"a", b"ab", b"1", b"12", b",", b"e", b'"}', b"tr"]
PIECES += [b"true", b"null", b'":"', b'", "', b"kind", b"am", "é".encode(), b"\xc3"]
PIECES += [bytes([byte]) for byte in range(0x20, 0x7F) if bytes([byte]) not in PIECES]
SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 5},
            "kind": {"enum": ["a", "ab", "abe"]},
            "n": {"type": "integer"},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "kind"],
    }
)
DOCUMENTS = ('{"name":"ab","kind":"abe"}', '{"name": "é", "kind": "a", "n": 12, "ok": true, "tags": ["e"]}')


def _tokens(vocab: Vocab, text: str) -> list[int]:
    # greedy longest-piece tokenization of `text` (what a model might draw)
    data, found = text.encode(), []
    while data:
        starting = (t for t in range(1, len(vocab)) if data.startswith(vocab.pieces[t]))
        token = max(starting, key=lambda t: len(vocab.pieces[t]))
        found.append(token)
        data = data[len(vocab.pieces[token]) :]
    return found


def _learnt(grammar: Grammar) -> int:
    # verdicts a grammar's masks have learnt so far: its own shortcuts, its own walks, the vocabulary's shared
    masks = grammar._masks
    return len(masks._tops) + len(masks._own) + len(masks.shared)


def test_a_finished_lookahead_leaves_nothing_for_a_document_to_learn() -> None:
    vocab = Vocab(PIECES, eog_ids=[0])
    grammar = Grammar.from_gbnf(json_schema_to_gbnf(SCHEMA), vocab)
    run = grammar.lookahead(60.0)
    assert run.finished and run.tops > 0 and grammar._ahead is not None and grammar._ahead.nbytes == 0
    learnt = _learnt(grammar)
    fresh = Grammar.from_gbnf(json_schema_to_gbnf(SCHEMA), Vocab(PIECES, eog_ids=[0]))
    for document in DOCUMENTS:
        matcher, plain = Matcher(grammar), Matcher(fresh)
        for token in [*_tokens(vocab, document), 0]:
            assert np.array_equal(matcher.mask(), plain.mask())
            assert matcher.accept(token) and plain.accept(token), document
        assert matcher.is_complete()
    # every state the documents met composed its mask from verdicts the lookahead had learnt
    assert _learnt(grammar) == learnt
    assert _learnt(fresh) > 0


def test_the_budget_bounds_a_run_and_the_next_run_resumes() -> None:
    vocab = Vocab(PIECES, eog_ids=[0])
    text = json_schema_to_gbnf(SCHEMA)
    whole = Grammar.from_gbnf(text, vocab).lookahead(60.0)
    grammar = Grammar.from_gbnf(text, Vocab(PIECES, eog_ids=[0]))
    nothing = grammar.lookahead(0.0)
    assert (nothing.tops, nothing.stacks, nothing.finished) == (0, 0, False)
    asked = 0
    paused_at = {3, 10, 30, 100, 300, 1000}  # questions answered "pause": between tops and inside walks

    def now_and_then() -> bool:
        nonlocal asked
        asked += 1
        return asked in paused_at

    runs: list[AheadRun] = []
    while not runs or not runs[-1].finished:
        runs.append(grammar.lookahead(60.0, pause=now_and_then))
        assert len(runs) <= len(paused_at) + 1
    assert len(runs) > 1
    assert sum(run.tops for run in runs) == whole.tops
    assert sum(run.stacks for run in runs) == whole.stacks
    assert grammar._ahead is not None and grammar._ahead.learnt == whole.tops
    last = grammar.lookahead(60.0)  # nothing left
    assert (last.tops, last.stacks, last.seconds, last.finished) == (0, 0, 0.0, True)
    assert nothing.seconds == 0.0
    assert last.total == pytest.approx(sum(run.seconds for run in runs))


def test_a_second_run_while_one_runs_does_nothing() -> None:
    grammar = Grammar.from_gbnf(json_object_grammar(), Vocab(PIECES, eog_ids=[0]))
    inner: list[AheadRun] = []

    def pause() -> bool:
        if not inner:
            inner.append(grammar.lookahead(60.0))  # from inside the first run: its lock is held
        return False

    outer = grammar.lookahead(60.0, pause=pause)
    assert inner == [AheadRun(0, 0, 0.0, 0.0, False)]
    assert outer.tops > 0


def test_the_search_is_bounded_in_stacks_and_depth() -> None:
    # JSON mode nests without end: the search stops at its bounds, and lets go of what it held
    grammar = Grammar.from_gbnf(json_object_grammar(), Vocab(PIECES, eog_ids=[0]))
    run = grammar.lookahead(600.0)
    assert run.finished
    ahead = grammar._ahead
    assert ahead is not None and ahead.nbytes == 0 and ahead.finished
    assert run.stacks <= ahead.max_stacks


@settings(max_examples=60, deadline=None)
@given(grammars(), vocabs(), st.lists(st.integers(0, 10**6), max_size=6), st.floats(0.0, 0.02))
def test_masks_after_a_lookahead_are_the_literal_masks(
    text: str, vocab: Vocab, choices: list[int], seconds: float
) -> None:
    grammar = compile_or_skip(text, vocab)
    grammar.lookahead(seconds)
    matcher = Matcher(grammar, max_stacks=300)  # ambiguous random grammars stop there (LimitError)
    with contextlib.suppress(LimitError):
        for choice in [*choices, None]:
            mask = unpack_mask(matcher.mask(), len(vocab))
            state = grammar._states.intern(matcher.stacks, 10**6)
            walked = compute_allowed(state, matcher.partial_utf8, grammar._decoded, 10**6)
            assert mask.tolist() == walked.tolist()
            allowed = np.flatnonzero(mask)
            if choice is None or allowed.size == 0 or not matcher.accept(int(allowed[choice % allowed.size])):
                break


def test_a_pause_stops_a_top_inside_its_walk_and_the_next_run_learns_it() -> None:
    grammar = Grammar.from_gbnf(json_schema_to_gbnf(SCHEMA), Vocab(PIECES, eog_ids=[0]))
    asked = 0

    def second_question() -> bool:  # the first is asked before the first top, the next inside its walk
        nonlocal asked
        asked += 1
        return asked == 2

    stopped = grammar.lookahead(60.0, pause=second_question)
    assert (stopped.tops, stopped.stacks, stopped.finished) == (0, 0, False)
    questions: list[None] = []
    rest = grammar.lookahead(60.0, pause=lambda: bool(questions.append(None)))
    assert rest.finished and rest.tops > 0
    assert len(questions) > rest.stacks + 1  # asked inside the walks too, not only between tops


def test_an_interruption_is_a_deadline_that_also_passes_when_told() -> None:
    told = [False]
    interruption = Interruption(lambda: told[0])
    check_deadline(interruption)  # no time limit, not told: goes on
    told[0] = True
    with pytest.raises(DeadlineError):
        check_deadline(interruption)
    with pytest.raises(DeadlineError):
        check_deadline(Interruption(lambda: False, time.monotonic() - 1.0))  # its time limit passed
    assert float(Interruption(lambda: False, 5.0)) == 5.0
