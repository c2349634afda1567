"""Whole-vocabulary masks: the column walk gives exactly llama.cpp's apply, token by token."""

from __future__ import annotations

import contextlib
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from constraintd.engine import Grammar, GrammarError, LimitError, Matcher, Vocab, unpack_mask
from constraintd.engine.chat.requests import json_object_grammar
from constraintd.engine.grammar.stack_sets import State
from constraintd.engine.grammar.stacks import allows_token
from constraintd.engine.grammar.utf8 import decode_utf8
from constraintd.engine.masks import compute
from constraintd.engine.masks.compute import compute_allowed, walk
from constraintd.engine.schema.convert import json_schema_to_gbnf
from constraintd.engine.vocab.decoded import encode_partial, partial_bounds
from tests import reference
from tests.lockstep import Lockstep, SampleGrammar, Tally, byte_tokens, sample_grammars
from tests.oracle import LlamaGrammar, LlamaVocab
from tests.strategies import compile_or_skip, grammars, vocabs

MASKBENCH = Path(__file__).parents[2] / "vectors" / "maskbench-sample"

if TYPE_CHECKING:
    from tests.conftest import OracleReport
    from tests.engine.conftest import OpenVocab

PREFILLS = st.lists(
    st.sampled_from(
        [b"a", b"b", b"c", "é".encode(), "中".encode(), b"\xc3", b"\xe4", b"\xe4\xb8", b"\xf0\x9f"]
    ),
    max_size=4,
)


def literal_mask(matcher: Matcher) -> list[bool]:
    grammar = matcher.grammar
    vocab = grammar.vocab
    return [
        allows_token(
            grammar._rules,
            matcher.stacks,
            token,
            vocab.pieces[token],
            partial=matcher.partial_utf8,
            eog=token in vocab.eog_ids,
        )
        for token in range(len(vocab))
    ]


@settings(max_examples=80, deadline=None)
@given(grammars(), vocabs(), PREFILLS, st.lists(st.integers(0, 10**6), max_size=4))
def test_mask_is_the_literal_apply_of_every_token(
    text: str, vocab: Vocab, prefill: list[bytes], choices: list[int]
) -> None:
    grammar = compile_or_skip(text, vocab)
    matcher = Matcher(grammar, max_stacks=300)  # ambiguous random grammars stop there (LimitError)
    with contextlib.suppress(LimitError):
        for data in prefill:
            if not matcher.accept_bytes(data):
                break
        for choice in [*choices, None]:
            mask = unpack_mask(matcher.mask(), len(vocab))
            assert mask.tolist() == literal_mask(matcher)
            assert (
                mask.tolist()
                == compute_allowed(
                    grammar._states.intern(matcher.stacks, 10**6),
                    matcher.partial_utf8,
                    grammar._decoded,
                    10**6,
                ).tolist()
            )
            allowed = np.flatnonzero(mask)
            if choice is None or allowed.size == 0 or not matcher.accept(int(allowed[choice % allowed.size])):
                break


def _short_of(lead: int, tail: list[int]) -> bytes:
    # a lead byte and fewer continuation bytes than it announces: a sequence still unfinished
    needs = 1 if lead < 0xE0 else 2 if lead < 0xF0 else 3
    return bytes([lead, *tail[: needs - 1]])


# one piece sure to be unfinished, so that an example is not thrown away for having none (Hypothesis
# refuses a test that throws away most of what it draws)
_UNFINISHED = st.builds(_short_of, st.integers(0xC2, 0xF4), st.lists(st.integers(0x80, 0xBF), max_size=2))


@settings(max_examples=60, deadline=None)
@given(grammars(), st.lists(st.binary(min_size=1, max_size=3), max_size=30), _UNFINISHED)
def test_unfinished_sequences_judged_at_once_as_one_at_a_time(
    text: str, pieces: list[bytes], unfinished: bytes
) -> None:
    # as a whole walk judges a table's bare rows (their sequences decoded once into the code points they
    # could become, then judged together against the classes on top), and as State.partial_ok judges one
    pieces = [*pieces, unfinished]
    grammar = compile_or_skip(text, Vocab([b"</s>", b"a"], eog_ids=[0]))
    state = grammar._states.intern(Matcher(grammar).stacks, 10**6)
    assume(state is not None and state.char_tops)
    assert state is not None
    partials = [partial for piece in pieces if (partial := decode_utf8(piece)[1])[1] > 0]
    assume(partials)
    codes = np.array([encode_partial(partial) for partial in partials], dtype=np.int64)
    at_once = compute._bounds_ok(state, partial_bounds(codes))
    assert at_once.tolist() == [state.partial_ok(partial) for partial in partials]


def test_long_pieces_and_all_partial_lengths() -> None:
    pieces = [b"</s>", b" " * 40, b" " * 39 + b"x", "中".encode()[:1], "中".encode()[1:], "中".encode()[2:]]
    pieces += ["😀".encode()[:k] for k in (1, 2, 3)] + ["😀".encode()[k:] for k in (1, 2, 3)]
    pieces += [bytes((b,)) for b in range(0x80, 0xC0)]
    vocab = Vocab(pieces, eog_ids=[0])
    matcher = Matcher(Grammar.from_gbnf('root ::= " "* ("中" | "😀")*\n', vocab))
    for prefix in (b"", b"\xe4", b"\xe4\xb8", b"\xf0", b"\xf0\x9f", b"\xf0\x9f\x98"):
        twin = matcher.fork()
        assert twin.accept_bytes(prefix)
        assert unpack_mask(twin.mask(), len(vocab)).tolist() == literal_mask(twin)


# Oracle: masks identical to llama.cpp's, bit for bit, at every step. For each vocabulary and each sample
# grammar (tests/vectors/grammar-samples): every sample text tokenized by the vocabulary, then one token
# per byte (where the vocabulary has a token for every byte), then seeded random walks over the tokens
# llama.cpp allows. Steps are capped per vocabulary (llama.cpp's own mask costs ~0.1 s on 150k tokens,
# ~0.2 s on 262k); about 3,000 masks in all, a few minutes on two cores.
@dataclass(frozen=True)
class Budget:
    tokenized: int  # steps along each sample text, tokenized
    bytes: int  # steps along each sample text, a token per byte
    walks: int  # random walks per grammar
    walk: int  # steps per random walk


BUDGETS = {
    "qwen2": Budget(tokenized=12, bytes=8, walks=1, walk=8),
    "llama-bpe": Budget(tokenized=10, bytes=6, walks=1, walk=6),
    "llama-spm": Budget(tokenized=40, bytes=24, walks=2, walk=16),
    "gemma": Budget(tokenized=10, bytes=6, walks=1, walk=6),
}


# JSON mode (llama-server's grammar for {"type": "object"}) and a few MaskBench schemas through our converter
# (byte for byte llama.cpp's), with their valid documents as samples.
SCHEMA_SAMPLES = (
    "Glaiveai2K---calculate_area_0bc8b268.json",
    "Github_medium---o9782.json",
    "Kubernetes---kb_35_Normalized.json",
)


def sample_cases() -> list[SampleGrammar]:
    if not reference.llama_cpp_dir().exists():
        return []
    cases = sample_grammars()
    json_samples = next(case.samples for case in cases if case.name == "json")
    cases.append(SampleGrammar("json-mode", json_object_grammar(), json_samples))
    for name in SCHEMA_SAMPLES:
        document = json.loads((MASKBENCH / name).read_text())
        grammar = json_schema_to_gbnf(json.dumps(document["schema"]))
        valid = [json.dumps(t["data"], separators=(",", ":"), ensure_ascii=False) for t in document["tests"]]
        cases.append(SampleGrammar(f"schema-{name.split('---')[0]}", grammar, tuple(valid[:2])))
    return cases


def trigger_tokens(llama_vocab: LlamaVocab, texts: tuple[str, ...]) -> list[int] | None:
    tokens = [llama_vocab.tokenize(t.encode(), parse_special=True) for t in texts]
    return [t[0] for t in tokens] if all(len(t) == 1 for t in tokens) else None


@pytest.mark.oracle
@pytest.mark.parametrize("vocab_name", list(BUDGETS))
@pytest.mark.parametrize("case", sample_cases(), ids=lambda case: case.name)
def test_masks_identical_to_llama_cpp(
    case: SampleGrammar, vocab_name: str, oracle_vocab: OpenVocab, oracle_report: OracleReport
) -> None:
    llama_vocab, vocab = oracle_vocab(vocab_name)
    triggers = trigger_tokens(llama_vocab, case.trigger_texts)
    if triggers is None:
        pytest.skip(f"a trigger text is not one token in {vocab_name}")
    options = {"trigger_patterns": case.trigger_patterns, "trigger_tokens": triggers}
    expected = LlamaGrammar.create(llama_vocab, case.text, **options)
    try:
        grammar: Grammar | None = Grammar.from_gbnf(case.text, vocab, **options)
    except GrammarError:
        grammar = None
    alike = (expected is None) == (grammar is None)
    oracle_report.add("grammars refused alike", vocab_name, identical=int(alike), total=1)
    assert (expected is None) == (grammar is None)
    if expected is None or grammar is None:
        return
    expected.close()
    budget = BUDGETS[vocab_name]
    tally = Tally()
    rng = np.random.default_rng(zlib.crc32(f"{vocab_name}/{case.name}".encode()))
    by_byte = byte_tokens(vocab)

    def lockstep() -> Lockstep:
        llama = LlamaGrammar.create(llama_vocab, case.text, **options)
        assert llama is not None and grammar is not None
        return Lockstep(llama, Matcher(grammar), tally, rng)

    runs: list[Callable[[Lockstep], None]] = []
    for text in case.samples:
        tokens = llama_vocab.tokenize(text.encode(), parse_special=True)
        runs.append(lambda s, tokens=tokens: s.follow(tokens, budget.tokenized))
        if by_byte is not None:
            as_bytes = [by_byte[b] for b in text.encode()]
            runs.append(lambda s, as_bytes=as_bytes: s.follow(as_bytes, budget.bytes))
    runs.extend(lambda s: s.walk(budget.walk) for _ in range(budget.walks))
    for run in runs:
        session = lockstep()
        try:
            run(session)
        finally:
            session.llama.close()
    oracle_report.add("masks", vocab_name, identical=tally.identical_masks, total=tally.masks)
    oracle_report.add("allows verdicts", vocab_name, identical=tally.identical_verdicts, total=tally.verdicts)
    # every token llama.cpp accepted (its mask allowed it and it did not abort), constraintd accepted too
    oracle_report.add("accept verdicts", vocab_name, identical=tally.accepted, total=tally.accepted)
    assert not tally.differences, tally.differences[:3]
    assert tally.identical_verdicts == tally.verdicts
    if grammar.lazy and case.samples:
        assert tally.triggered, "no sample reached the trigger"


@settings(max_examples=60, deadline=None)
@given(grammars(), vocabs(), st.data())
def test_a_walk_of_some_rows_decides_them_as_the_whole_walk(
    text: str, vocab: Vocab, data: st.DataObject
) -> None:
    # from a stack top cut short by an escape mark (so rows may be uncertain), some rows walked alone
    # (one at a time when few, column by column when not) get the verdicts the whole walk gives them
    grammar = compile_or_skip(text, vocab)
    rules = grammar._rules
    char_positions = [pos for pos, cls in enumerate(rules.classes) if cls is not None]
    assume(char_positions)
    top = data.draw(st.sampled_from(char_positions))
    start = grammar._states.intern([(rules.escape, top)], 10**6)
    assert start is not None
    table = grammar._decoded.fresh_table()
    rows = np.array(
        sorted(data.draw(st.sets(st.integers(0, max(table.ids.size - 1, 0)), max_size=table.ids.size))),
        dtype=np.int64,
    )
    rows = rows[rows < table.ids.size]
    whole_allowed, whole_unsure = walk(table, table.columns, start, 10**6)
    for few in (0, 32):
        with mock.patch.object(compute, "_FEW_ROWS", few):
            allowed, unsure = walk(table, table.columns, start, 10**6, rows=rows)
        assert set(allowed.tolist()) == set(whole_allowed.tolist()) & set(rows.tolist())
        assert set(unsure.tolist()) == set(whole_unsure.tolist()) & set(rows.tolist())


# Fixed-length runs of one char class (walked by their run counts, compute._walk_run): inline repeats of a
# class, repeats of a rule that is one class, a literal's repeated character, a negated and an `any`
# class, runs that end the grammar or run into a token terminal or another run.
RUN_GRAMMARS = (
    'root ::= "\\"" x{8} "-" x{4} "-" x{4} "\\"" "b"?\nx ::= [a-c0-9]',
    'root ::= [a-c]{3} [a-b]{2} ("c" | "é"){0,2}',
    'root ::= "aaaa" "b" | "aab" [^a]{3}',
    'root ::= .{5} | [^é]{3} <[1]> "a"',
    "root ::= [a-c😀]{6}",
)
RUN_PIECES = st.text(alphabet='abc01-"é😀', min_size=1, max_size=7).map(str.encode)


@settings(max_examples=80, deadline=None)
@given(
    st.one_of(st.sampled_from(RUN_GRAMMARS), grammars()),
    st.lists(st.one_of(RUN_PIECES, st.sampled_from([b"\xc3", b"\xe4\xb8", b"\xf0\x9f"])), max_size=40),
    st.data(),
)
def test_runs_of_one_class_are_decided_as_the_walk_decides_them(
    text: str, extra: list[bytes], data: st.DataObject
) -> None:
    # from every stack top (escape mark below) and every state a sample reaches, the walk that reads the
    # run counts gives the rows, some of them or all, the verdicts of the walk column by column
    base = sorted({bytes((b,)) for ch in 'abc01-"é😀' for b in ch.encode()})
    vocab = Vocab([b"</s>", *base, *dict.fromkeys(extra)], eog_ids=[0])
    grammar = compile_or_skip(text, vocab)
    rules = grammar._rules
    table = grammar._decoded.fresh_table()
    runs = compute.ClassRuns(table)
    char_positions = [pos for pos, cls in enumerate(rules.classes) if cls is not None]
    starts = [grammar._states.intern([(rules.escape, pos)], 10**6) for pos in char_positions]
    matcher = Matcher(grammar, max_stacks=300)
    with contextlib.suppress(LimitError):
        for data_bytes in (b'"', b"a", b"b", b"0"):
            if not matcher.accept_bytes(data_bytes):
                break
            starts.append(grammar._states.intern(matcher.stacks, 10**6))
    every = np.arange(table.ids.size, dtype=np.int64)
    some = np.array(
        sorted(data.draw(st.sets(st.integers(0, max(table.ids.size - 1, 0)), max_size=table.ids.size))),
        dtype=np.int64,
    )
    some = some[some < table.ids.size]
    for start in starts:
        assert start is not None
        for rows in (every, some):
            expected = walk(table, table.columns, start, 10**6, rows=rows)
            for few in (0, 32):
                with mock.patch.object(compute, "_FEW_ROWS", few):
                    found = walk(table, table.columns, start, 10**6, rows=rows, runs=runs)
                assert found[0].tolist() == expected[0].tolist()
                assert found[1].tolist() == expected[1].tolist()


def test_a_run_counts_a_rows_code_points_in_its_class() -> None:
    vocab = Vocab([b"</s>", b"ab1-", b"a", b"\xc3", b"-ab", b"ba\xc3", b"abba"], eog_ids=[0])
    grammar = Grammar.from_gbnf('root ::= [a-b]{3} "-"', vocab)
    table = grammar._decoded.fresh_table()
    runs = compute.ClassRuns(table)
    counts = runs.counts((True, ((ord("a"), ord("b")),)))
    pieces = [vocab.pieces[token] for token in table.ids.tolist()]
    assert dict(zip(pieces, counts.tolist(), strict=True)) == {
        b"ab1-": 2,
        b"a": 1,
        b"\xc3": 0,
        b"-ab": 0,
        b"ba\xc3": 2,
        b"abba": 4,
    }
    assert runs.known((True, ((ord("a"), ord("b")),)))
    assert not runs.known((True, ((ord("a"), ord("a")),)))
    for char_class in ((True, ((97, 98),)), (False, ((97, 97),)), (True, ((97, 97), (45, 97), (96, 98)))):
        assert runs.count_starting(char_class) == runs.starting(char_class).size
    assert runs.starting((True, ((97, 98),))).tolist() == [
        row for row, piece in enumerate(pieces) if piece[:1] in (b"a", b"b")
    ]
    assert dict(zip(pieces, runs.lengths().tolist(), strict=True)) == {
        b"ab1-": 4,
        b"a": 1,
        b"\xc3": 0,
        b"-ab": 3,
        b"ba\xc3": 2,
        b"abba": 4,
    }
    start = grammar._initial
    assert start is not None
    run = start.class_run(10**6, 10)
    assert run is not None
    char_class, length, end = run
    assert (char_class, length) == ((True, ((ord("a"), ord("b")),)), 3)
    assert end is not None
    after_dash = end.step(ord("-"), 10**6)
    assert end.class_run(10**6, 10) == ((True, ((ord("-"), ord("-")),)), 1, after_dash)
    assert after_dash is not None and after_dash.has_empty and after_dash.class_run(10**6, 10) is None
    second = start.step(ord("a"), 10**6)
    assert second is not None
    assert start.class_run(10**6, 2) == (char_class, 2, second.step(ord("b"), 10**6))


# States that move some code points back to themselves (a string's `char*`, a right-recursive rule, `.*`),
# where the walk carries rows to the first code point outside the loop (compute.walk's `carry`): loops
# with escapes inside, loops ended by a literal, by another loop, by a token terminal, or by the end.
LOOP_GRAMMARS = (
    'root ::= "\\"" char* "\\"" ("," "\\"" char* "\\"")*\nchar ::= [^"\\\\] | "\\\\" ["\\\\n]',
    'root ::= [a-c]* "-" [a-c]+ | "a" x\nx ::= "b" x | "c" x | "-"',
    'root ::= ([ab] | "c" "a")* "." [^.]*',
    # token 11, the first of LOOP_RUNS, taken by its id inside the loop, then cut short in a character
    # the loop's class cannot hold
    'root ::= "a" [a-c]* <[11]> [a-c]* | [^"a]* <[1]>',
    'root ::= .* "é" | [abé]+ "\\""',
)
# pieces that run on in a loop, or leave it, past their first code point, in every drawn vocabulary
LOOP_RUNS = (b"ab\xe4", b"abcab", b"ab-c", b'a"b', b"b\\n", b"cccc.", "éaé".encode(), b'ab"')
LOOP_PIECES = st.text(alphabet='abc"\\-.,é', min_size=1, max_size=9).map(str.encode)


def _walk_starts(
    grammar: Grammar, vocab: Vocab, choices: list[int]
) -> tuple[list[State | None], set[State]]:
    """States to walk from: every character position's top cut short by an escape mark, and the states a
    path of allowed tokens reaches (`choices` picks each), which have no escape mark and are also held to
    llama.cpp's apply."""
    rules = grammar._rules
    char_positions = [pos for pos, cls in enumerate(rules.classes) if cls is not None]
    starts = [grammar._states.intern([(rules.escape, pos)], 10**6) for pos in char_positions]
    reached: set[State] = set()
    matcher = Matcher(grammar, max_stacks=300)
    with contextlib.suppress(LimitError):
        for choice in choices:
            state = grammar._states.intern(matcher.stacks, 10**6)
            if state is None:
                break
            starts.append(state)
            reached.add(state)
            allowed = np.flatnonzero(unpack_mask(matcher.mask(), len(vocab)))
            if allowed.size == 0 or not matcher.accept(int(allowed[choice % allowed.size])):
                break
    return starts, reached


def _walks_agree(
    grammar: Grammar, vocab: Vocab, starts: list[State | None], reached: set[State],
    settings: list[dict[str, int]],
) -> None:
    """Each start walked under each of `settings` (constants of masks/compute.py patched): the same rows
    allowed, the same uncertain, the same columns at which rows met the escape mark; and a reached state's
    rows those llama.cpp's apply allows."""
    rules = grammar._rules
    table = grammar._decoded.fresh_table()
    for start in starts:
        assert start is not None
        found = []
        for patched in settings:
            escapes: compute.Escapes = []
            with contextlib.ExitStack() as patches:
                for name, value in patched.items():
                    patches.enter_context(mock.patch.object(compute, name, value))
                allowed_rows, unsure = walk(table, table.columns, start, 10**6, escapes=escapes)
            met, columns = compute.escape_columns(escapes)
            met_at = list(zip(met.tolist(), columns.tolist(), strict=True))
            found.append((allowed_rows.tolist(), unsure.tolist(), met_at))
        assert all(one == found[0] for one in found)
        if start in reached:
            assert set(found[0][0]) == {
                row for row, token in enumerate(table.ids.tolist())
                if allows_token(rules, start.stacks, token, vocab.pieces[token])
            }


@settings(max_examples=80, deadline=None)
@given(
    st.one_of(st.sampled_from(LOOP_GRAMMARS), grammars()),
    st.lists(st.one_of(LOOP_PIECES, st.sampled_from([b"\xc3", b"a\xe4\xb8", b"\xf0\x9f"])), max_size=60),
    st.lists(st.integers(0, 10**6), max_size=6),
)
def test_rows_carried_through_loops_get_the_verdicts_of_the_walk_a_column_at_a_time(
    text: str, extra: list[bytes], choices: list[int]
) -> None:
    # Every row walked column by column (no few rows walked singly) from every stack top cut short by an
    # escape mark and from the states a path reaches: the same rows allowed, the same uncertain, and the
    # same columns at which rows met the mark as when each row is walked alone, one code point at a time.
    base = sorted({bytes((b,)) for ch in 'abc"\\-.,é' for b in ch.encode()})
    vocab = Vocab([b"</s>", *base, *dict.fromkeys([*LOOP_RUNS, *extra])], eog_ids=[0])
    assert vocab.pieces[11] == LOOP_RUNS[0]
    grammar = compile_or_skip(text, vocab)
    starts, reached = _walk_starts(grammar, vocab, choices)
    # every loop's run ends counted, however few rows the small vocabulary leaves in it
    _walks_agree(grammar, vocab, starts, reached, [
        {"_FEW_ROWS": few, "RUN_END_SHARE": 10**9} for few in (0, 10**9)
    ])


def test_run_ends_say_where_each_row_leaves_a_set_of_code_points() -> None:
    pieces = [b"</s>", b"abc", b"a-b", b"-", b"ab\xc3", b"\xc3", "aé-b".encode(), b"bbbbbb", b"c"]
    vocab = Vocab(pieces, eog_ids=[0])
    table = Grammar.from_gbnf('root ::= [a-c]*', vocab)._decoded.fresh_table()
    ranges = ((ord("a"), ord("b")), (ord("é"), ord("é")))
    assert table.run_ends(ranges, build=False) is None
    ends = table.run_ends(ranges)
    assert ends is not None
    assert table.run_ends(ranges, build=False) is ends  # kept
    assert table.run_end_bytes == sum(column.nbytes for column in ends)
    held = {ord("a"), ord("b"), ord("é")}
    for row, token in enumerate(table.ids.tolist()):
        code_points = decode_utf8(vocab.pieces[token])[0]
        for j in range(len(code_points)):
            expected = next((k for k in range(j, len(code_points)) if code_points[k] not in held),
                            len(code_points))
            assert int(ends[j][row]) == expected, (vocab.pieces[token], j)
    assert [column.size for column in ends] == list(table.count_from)


# copies of a rule (a minimum repetition) and chains of links (a bounded one), with no state looping on
# itself, so that only chains move rows past a column: escape marks below them, literals after them, a
# chain of two-character links, token tops inside
CHAIN_GRAMMARS = (
    'root ::= "\\"" char{3,12} "\\"" "x"\nchar ::= [^"\\\\] | "\\\\" ["\\\\n]',
    'root ::= [a-c]{2,7} "-" [a-c]{0,5} "."',
    'root ::= ("ab"){2,5} "." | "a" [bc]{1,4}',
    'root ::= x{4} "," x{0,3}\nx ::= [abé] | "\\\\" "n"',
    'root ::= "a" [a-c]{1,6} <[11]> [a-c]{0,3} | [^"a]{2,5} <[1]>',
)
CHAIN_PIECES = st.text(alphabet='abc"\\-.,é', min_size=1, max_size=14).map(str.encode)


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from(CHAIN_GRAMMARS),
    st.lists(st.one_of(CHAIN_PIECES, st.sampled_from([b"\xc3", b"a\xe4\xb8", b"abab\xf0\x9f"])), max_size=60),
    st.lists(st.integers(0, 10**6), max_size=8),
)
def test_rows_carried_along_chains_get_the_verdicts_of_the_walk_a_column_at_a_time(
    text: str, extra: list[bytes], choices: list[int]
) -> None:
    # Every row walked column by column from every stack top cut short by an escape mark and from the
    # states a path reaches, with rows carried along chains of states however few they are, and without:
    # the same rows allowed, the same uncertain, the same columns at which rows met the mark.
    base = sorted({bytes((b,)) for ch in 'abc"\\-.,é' for b in ch.encode()})
    runs = [*LOOP_RUNS, b"abababab", b"aaaaaaaaaaaaaaa", *extra]
    vocab = Vocab([b"</s>", *base, *dict.fromkeys(runs)], eog_ids=[0])
    assert vocab.pieces[11] == LOOP_RUNS[0]
    grammar = compile_or_skip(text, vocab)
    starts, reached = _walk_starts(grammar, vocab, choices)
    _walks_agree(grammar, vocab, starts, reached, [
        {"_FEW_ROWS": 0, "_CHAIN_ROWS": chain_rows, "_CHAIN_SHARE": 10**9} for chain_rows in (1, 10**9)
    ])


def test_a_chain_of_copies_carries_rows_past_its_columns() -> None:
    # `[a-c]{6}` has no state looping on itself: the rows go along its copies by the run ends of [a-c]
    pieces = [b"</s>", b"a", b"ab", b"abc", b"abca", b"abcab", b"abcabc", b"abcabcx", b"ab-"]
    vocab = Vocab(pieces, eog_ids=[0])
    grammar = Grammar.from_gbnf('root ::= "\\"" [a-c]{6} "x"', vocab)
    rules = grammar._rules
    table = grammar._decoded.fresh_table()
    start = grammar._states.intern([(rules.escape, rules.rule_starts[0] + 1)], 10**6)
    assert start is not None
    counted: list[object] = []
    original = type(table).run_ends

    def spy(self: object, ranges: object, *, build: bool = True) -> object:
        counted.append(ranges)
        return original(self, ranges, build=build)  # type: ignore[arg-type]

    with (
        mock.patch.object(type(table), "run_ends", spy),
        mock.patch.object(compute, "_FEW_ROWS", 0),
        mock.patch.object(compute, "_CHAIN_ROWS", 1),
        mock.patch.object(compute, "_CHAIN_SHARE", 10**9),
    ):
        allowed_rows, _ = walk(table, table.columns, start, 10**6)
    assert ((ord("a"), ord("c")),) in counted
    assert sorted(vocab.pieces[token] for token in table.ids[allowed_rows].tolist()) == [
        b"a", b"ab", b"abc", b"abca", b"abcab", b"abcabc", b"abcabcx"
    ]
