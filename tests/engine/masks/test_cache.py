"""The grammar's mask caches: whole masks and per-position verdicts give exactly the walked mask."""

from __future__ import annotations

import contextlib
import gc
import time
import zlib
from typing import TYPE_CHECKING
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constraintd.engine import Grammar, LimitError, Matcher, Vocab, unpack_mask
from constraintd.engine.masks import cache as mask_cache
from constraintd.engine.masks.bitmask import pack_mask
from constraintd.engine.masks.cache import MaskCache, SharedVerdicts
from constraintd.engine.masks.compute import compute_mask, walk
from constraintd.engine.masks.verdicts import SHIFT_MARK, ShiftedVerdict, top_verdict
from constraintd.errors import DeadlineError
from tests.strategies import compile_or_skip, grammars, vocabs

if TYPE_CHECKING:
    from tests.conftest import OracleReport
    from tests.engine.conftest import OpenVocab

# Strings nested at different depths: the same string position under different stacks.
GRAMMAR = 'root ::= value\nvalue ::= "[" (value ("," value)*)? "]" | "\\"" [^"]* "\\""\n'
PIECES = [
    b"</s>",
    b"[",
    b"]",
    b",",
    b'"',
    b"a",
    b"ab",
    b'a"',
    b'"]',
    b'"],',
    b'"]]',
    b",[",
    b'""',
    b"\xc3",
    b"\xa9",
    b"b",
]
VOCAB = Vocab(PIECES, eog_ids=[0])
TEXTS = ['["a"]', '[["ab"],"a"]', '[[["a","ab"]]]', '[""]']


def walk_states(matcher: Matcher, text: str) -> list[Matcher]:
    by_piece = {piece: token for token, piece in enumerate(PIECES)}
    seen = [matcher.fork()]
    for char in text:
        assert matcher.accept(by_piece[char.encode()])
        seen.append(matcher.fork())
    return seen


def expected_mask(matcher: Matcher) -> np.ndarray:
    state = matcher.grammar._states.intern(matcher.stacks, 10**6)
    return compute_mask(state, matcher.partial_utf8, matcher.grammar._decoded, 10**6)


def follow_choices(matcher: Matcher, n_tokens: int, choices: list[int]) -> None:
    """Takes the allowed tokens `choices` pick (an index modulo the tokens allowed) one after another,
    checking every mask met, the last one's too, against the walked mask."""
    for choice in [*choices, None]:
        mask = matcher.mask()
        assert mask.tolist() == expected_mask(matcher).tolist()
        allowed = np.flatnonzero(unpack_mask(mask, n_tokens))
        if choice is None or allowed.size == 0 or not matcher.accept(int(allowed[choice % allowed.size])):
            break


def test_masks_from_the_caches_are_the_walked_masks() -> None:
    grammar = Grammar.from_gbnf(GRAMMAR, VOCAB)
    for text in TEXTS:
        for matcher in walk_states(Matcher(grammar), text):
            assert matcher.mask().tolist() == expected_mask(matcher).tolist()
    assert grammar._masks.tops > 0


def test_verdicts_are_out_of_the_collectors_sight() -> None:
    # a vocabulary keeps tens of thousands of verdicts: once collected, none is tracked, so no full
    # collection walks them
    vocab = Vocab(PIECES, eog_ids=[0])
    grammar = Grammar.from_gbnf(GRAMMAR, vocab)
    for text in TEXTS:
        for matcher in walk_states(Matcher(grammar), text):
            matcher.mask()
    gc.collect()
    masks = grammar._masks
    kept = [*masks.shared.items(), *masks._tops.items(), *masks._own.items()]
    assert kept
    assert not [verdict for _, verdict in kept if gc.is_tracked(verdict)]


def test_tiny_caches_give_the_same_masks() -> None:
    grammar = Grammar.from_gbnf(GRAMMAR, VOCAB)
    grammar._masks = MaskCache(
        grammar._states, grammar._decoded, max_mask_bytes=1, max_tops=1, shared=SharedVerdicts(max_bytes=1)
    )
    for text in TEXTS:
        for matcher in walk_states(Matcher(grammar), text):
            assert matcher.mask().tolist() == expected_mask(matcher).tolist()
            assert len(grammar._masks) <= 1 and grammar._masks.tops <= 1


def test_a_state_seen_again_gets_the_same_mask_object() -> None:
    grammar = Grammar.from_gbnf(GRAMMAR, VOCAB)
    first, second = Matcher(grammar), Matcher(grammar)
    assert first.mask() is second.mask()
    assert not first.mask().flags.writeable


def test_after_an_unfinished_character() -> None:
    grammar = Grammar.from_gbnf(GRAMMAR, VOCAB)
    matcher = Matcher(grammar)
    assert matcher.accept(1) and matcher.accept(4) and matcher.accept(13)  # [ " and the first byte of é
    assert matcher.mask().tolist() == expected_mask(matcher).tolist()
    assert matcher.allows(14) and not matcher.allows(5)


@settings(max_examples=80, deadline=None)
@given(
    grammars(),
    vocabs(),
    st.lists(st.integers(0, 10**6), max_size=6),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([0, 16]),
)
def test_any_context_depth_gives_the_walked_mask(
    text: str, vocab: Vocab, choices: list[int], depth: int, max_new_tops: int
) -> None:
    # shallow tops leave many tokens uncertain (decided by the walk over them); no new tops: walk whole
    grammar = compile_or_skip(text, vocab)
    matcher = Matcher(grammar, max_stacks=300)
    with (
        mock.patch.object(mask_cache, "CONTEXT_DEPTH", depth),
        mock.patch.object(mask_cache, "MAX_NEW_TOPS", max_new_tops),
        mock.patch.object(mask_cache, "MAX_NEW_NARROW_TOPS", max_new_tops * 4),
        contextlib.suppress(LimitError),
    ):
        follow_choices(matcher, len(vocab), choices)


def test_size_is_reported_and_forgetting_masks_changes_no_answer() -> None:
    vocab = Vocab([b"a", b"b", b"ab", b""], eog_ids=[3])
    grammar = Grammar.from_gbnf('root ::= "a" "b"*', vocab)
    matcher = Matcher(grammar)
    assert grammar._masks.nbytes == 0
    first = matcher.mask()
    assert len(grammar._masks) == 1
    assert grammar._masks.nbytes == first.nbytes
    grammar._masks.forget_masks()
    assert len(grammar._masks) == 0 and grammar._masks.nbytes == 0
    assert np.array_equal(matcher.mask(), first)


# Bounded repetitions: a chain position's verdict from its loop's, below the reach, and a walk above it.
# Pieces of 1 to 7 code points (one ending in an unfinished sequence), so that chains of about 7
# repetitions left have tokens on both sides of their reach.
CHAIN_PIECES = [
    b"</s>",
    b"a",
    b"b",
    b'"',
    b".",
    b"ab",
    b"ba",
    b'a"',
    b"aab",
    b'b".',
    b"abab",
    b"aaaaa",
    b'abab"',
    b"bababa",
    b"abababa",
    b"aaaaaaa",
    b"ab\xc3",
    b"\xa9",
]
CHAIN_VOCAB = Vocab(CHAIN_PIECES, eog_ids=[0])
CHAIN_BOUNDS = [
    "{0,1}",
    "{0,3}",
    "{0,5}",
    "{0,6}",
    "{0,7}",
    "{0,8}",
    "{1,9}",
    "{3,9}",
    "{5,8}",
    "{4,}",
    "*",
    "?",
]


def borrowing(share: int = 1) -> contextlib.ExitStack:
    """Every top borrows its loop's verdict when it can (not only with few tokens left), counted."""
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(mask_cache, "LOOP_SHARE", share))
    return stack


def test_a_chain_borrows_its_loops_verdict_and_walks_the_longer_tokens() -> None:
    vocab = Vocab(CHAIN_PIECES, eog_ids=[0])  # its own verdicts: nothing learned by other tests
    by_piece = {piece: token for token, piece in enumerate(CHAIN_PIECES)}
    with (
        borrowing(),
        mock.patch.object(MaskCache, "_from_loop", autospec=True, side_effect=MaskCache._from_loop) as spy,
    ):
        for text in ('root ::= "\\"" [ab]{0,7} "\\"" "."\n', 'root ::= "\\"" [ab]{0,9} "\\"" "."?\n'):
            matcher = Matcher(Grammar.from_gbnf(text, vocab))
            for piece in [b'"', *[b"a"] * 7, b'"']:
                assert matcher.mask().tolist() == expected_mask(matcher).tolist()
                assert matcher.accept(by_piece[piece])
            assert matcher.mask().tolist() == expected_mask(matcher).tolist()
    assert spy.call_count > 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(CHAIN_BOUNDS), min_size=1, max_size=4),
    st.sampled_from(['"\\"" "."', '"."?', '[ab] "\\""', '"\\"" [ab]{0,2} "."']),
    st.lists(st.integers(0, 10**6), max_size=12),
)
def test_chains_sharing_their_loops_give_the_walked_masks(
    bounds: list[str], after: str, choices: list[int]
) -> None:
    # grammars in turn on one vocabulary: what a chain or a loop learns is borrowed by the next ones, at
    # every reach, tokens looking past it walked
    with borrowing():
        for bound in bounds:
            grammar = Grammar.from_gbnf(f'root ::= "\\"" [ab]{bound} {after}\n', CHAIN_VOCAB)
            matcher = Matcher(grammar)
            follow_choices(matcher, len(CHAIN_VOCAB), choices)


# JSON's string character (llama.cpp's converter), bounded around qwen2's longest piece (128 code points)
CHAR_RULE = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})\n'
LONG_TEXT = "a" + " " * 90 + "=" * 20 + "Lorem ipsum dolor sit amet, consectetur adipiscing elit"


@pytest.mark.oracle
@pytest.mark.parametrize(
    ("least", "bound"), [(0, 5), (0, 64), (0, 127), (0, 128), (0, 129), (0, 300), (12, 40), (22, 4096)]
)
def test_bounded_strings_identical_to_llama_cpp(
    least: int, bound: int, oracle_vocab: OpenVocab, oracle_report: OracleReport
) -> None:
    # a string of `least` to `bound` characters (above 2,000, no bound: a loop after the copies), then a
    # space rule with a chain of its own; the text's long runs of spaces and '=' are long tokens, longer
    # than the repetitions left where they are met
    from tests.lockstep import Lockstep, Tally
    from tests.oracle import LlamaGrammar

    llama_vocab, vocab = oracle_vocab("qwen2")
    text = f'root ::= "\\"" char{{{least},{bound}}} "\\"" [ ]{{0,20}} "."\n' + CHAR_RULE
    grammar = Grammar.from_gbnf(text, vocab)
    tally = Tally()
    rng = np.random.default_rng(zlib.crc32(f"bounded/{least}/{bound}".encode()))
    document = '"' + (LONG_TEXT * 4)[: min(bound, 300)] + '"' + " " * 7 + "."
    tokens = llama_vocab.tokenize(document.encode(), parse_special=True)
    with mock.patch.object(MaskCache, "_from_loop", autospec=True, side_effect=MaskCache._from_loop) as spy:
        for run in range(3):
            llama = LlamaGrammar.create(llama_vocab, text)
            assert llama is not None
            session = Lockstep(llama, Matcher(grammar), tally, rng)
            try:
                session.follow(tokens, len(tokens) + 1) if run == 0 else session.walk(24)
            finally:
                llama.close()
    oracle_report.add("masks (bounded strings)", "qwen2", identical=tally.identical_masks, total=tally.masks)
    assert tally.identical_masks == tally.masks, tally.differences[:3]
    assert tally.accepted >= len(tokens)
    if least == 0 and bound > 8:
        assert spy.call_count > 0  # the chain's positions borrowed their loop's verdicts


@pytest.mark.parametrize(
    "pieces",
    [
        [b"a", b"ab", b"abc", b"\xc3", b"x\xe2\x82", b"\xe2\x82\xac\xe2", b"", b"abcdefg"],
        [bytes([97 + i % 26]) * (1 + i % 9) + (b"\xf0\x9f" if i % 5 == 0 else b"") for i in range(200)],
    ],
    ids=["mixed", "lengths-1-to-9"],
)
def test_counting_the_tokens_past_a_reach_agrees_with_listing_them(pieces: list[bytes]) -> None:
    table = Vocab(pieces).decoded().fresh_table()
    for reach in range(1, len(table.columns) + 3):
        listed = mask_cache._looking_past(table, reach)
        assert mask_cache._count_looking_past(table, reach) == listed.size, reach


@settings(max_examples=60, deadline=None)
@given(grammars(), vocabs(), st.lists(st.integers(0, 10**6), max_size=6), st.sampled_from([1, 2, 4]))
def test_tops_walked_without_a_key_give_the_walked_mask(
    text: str, vocab: Vocab, choices: list[int], depth: int
) -> None:
    # FEW_SHARE 1: every top that can is walked without its structural key and kept for its grammar alone
    # (a small vocabulary otherwise leaves it too many rows for that)
    grammar = compile_or_skip(text, vocab)
    matcher = Matcher(grammar, max_stacks=300)
    with (
        mock.patch.object(mask_cache, "CONTEXT_DEPTH", depth),
        mock.patch.object(mask_cache, "FEW_SHARE", 1),
        contextlib.suppress(LimitError),
    ):
        follow_choices(matcher, len(vocab), choices)


def test_verdicts_kept_for_one_grammar_are_counted_in_its_size() -> None:
    grammar = Grammar.from_gbnf(GRAMMAR, VOCAB)
    with mock.patch.object(mask_cache, "FEW_SHARE", 1):
        for text in TEXTS:
            for matcher in walk_states(Matcher(grammar), text):
                assert matcher.mask().tolist() == expected_mask(matcher).tolist()
    masks = grammar._masks
    assert len(masks._own) > 0 and masks._own.size > 0
    assert masks.nbytes == masks._masks.size + masks._own.size
    masks.forget_masks()  # the masks go, the verdicts stay (counted still)
    assert masks.nbytes == masks._own.size > 0


def test_a_mask_past_its_deadline_stops_and_leaves_no_half_made_mask() -> None:
    grammar = Grammar.from_gbnf(GRAMMAR, VOCAB)
    tried = 0
    for matcher in walk_states(Matcher(grammar), '[["ab"],"a"]'):
        state = grammar._states.intern(matcher.stacks, 10**6)
        with pytest.raises(DeadlineError, match="time limit"):  # the walk itself watches the clock
            compute_mask(state, matcher.partial_utf8, grammar._decoded, 10**6, deadline=time.monotonic() - 1)
        if matcher.mask_known():
            continue
        tried += 1
        with pytest.raises(DeadlineError, match="time limit"):
            matcher.mask(deadline=time.monotonic() - 1.0)
        assert not matcher.mask_known()
        assert np.array_equal(matcher.mask(deadline=time.monotonic() + 60.0), expected_mask(matcher))
        assert matcher.mask_known()
    assert tried


# Keys outside a known set (llama.cpp's converter writes them as a trie: `[^"a] char*`, `[^"b] char*`, ...):
# every class leaves the same stack after it, so each top after the first is decided from what the
# tokens' rest did there, and only the rows starting with a code point not met before are walked.
TRIE_PIECES = [
    b"</s>",
    b'"',
    b"a",
    b"b",
    b"c",
    b"ab",
    b"ba",
    b'b"',
    b'c":',
    b"abc",
    b'"a',
    b":",
    b"\xc3",
    b"c\xc3",
]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "c", "ab", "bc", "abc"]), min_size=2, max_size=4, unique=True),
    st.lists(st.integers(0, 10**6), max_size=8),
)
def test_classes_leaving_one_stack_share_what_the_rest_of_a_token_does(
    excluded: list[str], choices: list[int]
) -> None:
    vocab = Vocab(TRIE_PIECES, eog_ids=[0])  # its own verdicts: nothing learned by other tests
    shifted = vocab.decoded().verdicts().shifted
    for chars in excluded:
        grammar = Grammar.from_gbnf(f'root ::= "\\"" ([^"{chars}] [abc]*)? "\\"" ":"\n', vocab)
        matcher = Matcher(grammar)
        assert matcher.mask().tolist() == expected_mask(matcher).tolist()
        assert matcher.accept(TRIE_PIECES.index(b'"'))
        follow_choices(matcher, len(vocab), choices)
    # the stack each `[^"...]` leaves has one key (so has the one `[abc]` leaves in its loop): its entry
    # covers the first code points of every such class met
    rules = grammar._states.rules
    (excluding,) = [pos for pos, char_class in enumerate(rules.classes) if char_class and not char_class[0]]
    assert grammar._masks.structure is not None
    key = (SHIFT_MARK, *grammar._masks.structure.stack((rules.escape, rules.after[excluding])))
    learned = shifted.peek(key)
    assert learned is not None
    table = vocab.decoded().fresh_table()
    met = {
        value
        for value in table.first_code_points.tolist()
        if any(chr(value) not in f'"{c}' for c in excluded)
    }
    assert met <= set(table.first_code_points[learned.firsts].tolist()) <= met | {ord(c) for c in "abc"}




@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=70), st.integers(1, 40))
def test_a_shifted_verdict_keeps_its_flags_a_bit_a_row(flags: list[tuple[bool, bool]], firsts: int) -> None:
    allowed = np.array([a for a, _ in flags], dtype=np.bool_)
    uncertain = np.array([u for _, u in flags], dtype=np.bool_)
    learned = ShiftedVerdict.of(np.ones(firsts, dtype=np.bool_), allowed, uncertain)
    assert learned.allowed.tolist() == allowed.tolist()
    assert learned.uncertain.tolist() == uncertain.tolist()
    assert learned.nbytes == firsts + 2 * ((len(flags) + 7) // 8)
    assert not learned.allowed_bits.flags.writeable and not learned.firsts.flags.writeable

# The same trie deep in a stack: the tops under the escape mark hold the closing quote and what follows
# the key below it (`"` ":" ";" ","), and every grammar after the first decides its class's tops of each
# length from what the tokens' rest did after the first grammar's class.
DEEP_TRIE_PIECES = [*TRIE_PIECES, b"{", b"}", b",", b";", b'":;', b'b":;,}', b'a":', b";,"]
# 368 more pieces that close the key and go on below it ('d":', 'd"z', ...): the deeper tops leave many rows
# uncertain (so they are keyed) and allow few tokens (so their verdicts keep them as ids)
FILLED_TRIE_PIECES = [
    *DEEP_TRIE_PIECES,
    *(f'{a}"{b}'.encode() for a in "defghijklmnopqrstuvwxyz" for b in ":;,}zyxwvutsrqpo"),
]
DEEP_TRIE = (
    'root ::= "{" a "}"\na ::= b ","\nb ::= c ";"\nc ::= key ":"\nkey ::= "\\"" ([^"{}] [abc]*)? "\\""\n'
)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "c", "ab", "bc", "abc"]), min_size=2, max_size=4, unique=True),
    st.lists(st.integers(0, 10**6), max_size=8),
    st.booleans(),
)
def test_deeper_tops_of_classes_leaving_one_stack_share_it_too(
    excluded: list[str], choices: list[int], filled: bool
) -> None:
    vocab = Vocab(FILLED_TRIE_PIECES if filled else DEEP_TRIE_PIECES, eog_ids=[0])
    shifted = vocab.decoded().verdicts().shifted
    for chars in excluded:
        grammar = Grammar.from_gbnf(DEEP_TRIE.replace("{}", chars), vocab)
        matcher = Matcher(grammar)
        assert matcher.accept(DEEP_TRIE_PIECES.index(b"{"))
        assert matcher.accept(DEEP_TRIE_PIECES.index(b'"'))
        follow_choices(matcher, len(vocab), choices)
    rules = grammar._states.rules
    (excluding,) = [pos for pos, char_class in enumerate(rules.classes) if char_class and not char_class[0]]
    matcher = Matcher(grammar)
    assert matcher.accept(DEEP_TRIE_PIECES.index(b"{")) and matcher.accept(DEEP_TRIE_PIECES.index(b'"'))
    (stack,) = [stack for stack in matcher.stacks if stack[-1] == excluding]
    assert len(stack) > mask_cache.CONTEXT_DEPTH  # its tops are marked ones
    assert grammar._masks.structure is not None
    # the top under the closing quote: every grammar after the first meets the key of the stack its class
    # leaves again, and keeps what its class's rows did there (met once, a key is only remembered)
    left = (rules.escape, stack[-2], rules.after[excluding])
    assert shifted.peek((SHIFT_MARK, *grammar._masks.structure.stack(left))) is not None


def test_a_longer_tops_shift_is_kept_once_its_key_is_met_again() -> None:
    # Most longer tops' shift keys belong to one top alone (a string's class under a property of one
    # schema): what a top decided there is kept when its key comes back, not the first time it is met.
    vocab = Vocab(FILLED_TRIE_PIECES, eog_ids=[0])
    kept = []
    for chars in "abc":
        grammar = Grammar.from_gbnf(DEEP_TRIE.replace("{}", chars), vocab)
        matcher = Matcher(grammar)
        assert matcher.accept(DEEP_TRIE_PIECES.index(b"{")) and matcher.accept(DEEP_TRIE_PIECES.index(b'"'))
        assert matcher.mask().tolist() == expected_mask(matcher).tolist()
        rules = grammar._states.rules
        (excluding,) = [pos for pos, klass in enumerate(rules.classes) if klass and not klass[0]]
        (stack,) = [stack for stack in matcher.stacks if stack[-1] == excluding]
        assert grammar._masks.structure is not None
        left = (rules.escape, stack[-2], rules.after[excluding])
        key = (SHIFT_MARK, *grammar._masks.structure.stack(left))
        kept.append(vocab.decoded().verdicts().shifted.peek(key) is not None)
    assert kept == [False, True, True]


def test_a_deeper_tops_verdict_keeps_the_same_shift_as_ids_and_as_words() -> None:
    # A deeper top's verdict, learned the usual way, leaves what it decided of its class's rows under the
    # key of the stack its class leaves (`_keep_long_shift`). Its allowed tokens may be kept as ids (few)
    # or as a packed mask (many): both forms keep the same rows.
    vocab = Vocab(FILLED_TRIE_PIECES, eog_ids=[0])
    grammar = Grammar.from_gbnf(DEEP_TRIE.replace("{}", "a"), vocab)
    matcher = Matcher(grammar)
    assert matcher.accept(DEEP_TRIE_PIECES.index(b"{")) and matcher.accept(DEEP_TRIE_PIECES.index(b'"'))
    matcher.mask()  # the grammar's structural ids exist from here on
    rules = grammar._states.rules
    (excluding,) = [pos for pos, char_class in enumerate(rules.classes) if char_class and not char_class[0]]
    (stack,) = [stack for stack in matcher.stacks if stack[-1] == excluding]
    masks = grammar._masks
    top = (rules.escape, *stack[-2:])
    shift = masks._long_shift(top)
    assert shift is not None
    key, char_class = shift
    table = grammar._decoded.fresh_table()
    start = grammar._states.intern([top], 10**6)
    assert start is not None
    allowed_rows, uncertain = walk(table, table.columns, start, 10**6)
    ids = np.sort(table.ids[allowed_rows])
    assert ids.size and uncertain.size  # both forms have something to keep
    bits = np.zeros(len(vocab), dtype=np.bool_)
    bits[ids] = True
    kept = []
    for verdict in (
        top_verdict(None, ids, uncertain, 0),
        top_verdict(pack_mask(bits), np.zeros(0, dtype=np.int64), uncertain, 0),
    ):
        masks.shared.shifted.pop(key)
        masks._keep_long_shift(verdict, key, char_class)
        learned = masks.shared.shifted.peek(key)
        assert learned is not None
        kept.append((learned.firsts.tolist(), learned.allowed.tolist(), learned.uncertain.tolist()))
    assert kept[0] == kept[1]
    assert any(kept[0][1])  # some row of the class is allowed


# Whitespace runs and what may follow them: pieces that start with blanks and go on, or stop, or run on
WHITESPACE_PIECES = [
    b"</s>",
    b" ",
    b"  ",
    b"\t",
    b"\n",
    b" the",
    b"  the",
    b' "',
    b'  "',
    b" }",
    b"\t}",
    b' ",',
    b'"',
    b",",
    b"}",
    b"{",
    b"a",
    b"b",
    b'a"',
    b" a",
    b"  a\xc3",
    b" \xc3",
    b"\xa9",
]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from(['"a"', '"b"', "[ab]", '"}"', '","']), min_size=1, max_size=3),
    st.sampled_from(["{0,3}", "{0,20}", "*", "{1,2}"]),
    st.lists(st.integers(0, 10**6), max_size=14),
)
def test_tops_over_a_whitespace_run_walk_only_the_rows_that_go_on_below(
    after: list[str], bound: str, choices: list[int]
) -> None:
    # `{` then blanks, then one of `after` per round: the tops (escape, p, blank) leave every row starting
    # with a blank uncertain, and the longer tops walk only those whose code point where they left the
    # blanks could go on from p; the masks stay the walked ones
    vocab = Vocab(WHITESPACE_PIECES, eog_ids=[0])  # its own verdicts: nothing learned by other tests
    alternates = " | ".join(f"space {item}" for item in after)
    text = f'root ::= "{{" ({alternates}) ("," root)?\nspace ::= | " " | "\\n" [ \\t]{bound}\n'
    matcher = Matcher(Grammar.from_gbnf(text, vocab))
    follow_choices(matcher, len(vocab), choices)
    matcher = Matcher(Grammar.from_gbnf(text, vocab))
    for piece in [b"{", b"\n", b"  ", b"\t"]:
        if not matcher.accept(WHITESPACE_PIECES.index(piece)):
            break
        assert matcher.mask().tolist() == expected_mask(matcher).tolist()


def test_a_whitespace_run_before_a_literal_leaves_the_blank_rows_unwalked() -> None:
    vocab = Vocab(WHITESPACE_PIECES, eog_ids=[0])
    grammar = Grammar.from_gbnf('root ::= "{" space "a" "}"\nspace ::= | " " | "\\n" [ \\t]{0,5}\n', vocab)
    matcher = Matcher(grammar)
    walked: list[tuple[int, int]] = []
    real = MaskCache._going_below

    def going_below(self: MaskCache, *args: object) -> np.ndarray:
        found = real(self, *args)  # type: ignore[arg-type]
        rows = args[1]
        assert isinstance(rows, np.ndarray)
        walked.append((rows.size, found.size))
        return found

    with mock.patch.object(MaskCache, "_going_below", going_below):
        for piece in [b"{", b"\n", b" ", b" "]:
            assert matcher.accept(WHITESPACE_PIECES.index(piece))
            assert matcher.mask().tolist() == expected_mask(matcher).tolist()
    # " the", "  the", ' "', ... met the mark after their blanks; only " a" (and "  a" cut short) can go
    # on to "a": the others were rejected without a walk
    assert walked, "no top over the blanks was walked from its shorter one"
    assert all(found < rows for rows, found in walked)
    assert len(vocab.decoded().verdicts().escapes) > 0
