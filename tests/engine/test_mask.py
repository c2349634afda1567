"""Whole-vocabulary masks: the column walk gives exactly llama.cpp's apply, token by token."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from constraintd.engine import Grammar, GrammarError, Matcher, Vocab, unpack_mask
from constraintd.engine.stacks import allows_token
from tests.strategies import grammars, vocabs

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
            grammar.rules,
            matcher.stacks,
            token,
            vocab.pieces[token],
            partial=matcher._partial,
            eog=token in vocab.eog_ids,
        )
        for token in range(len(vocab))
    ]


@settings(max_examples=80, deadline=None)
@given(grammars(), vocabs(), PREFILLS, st.lists(st.integers(0, 10**6), max_size=4))
def test_mask_is_the_literal_apply_of_every_token(
    text: str, vocab: Vocab, prefill: list[bytes], choices: list[int]
) -> None:
    try:
        grammar = Grammar.from_gbnf(text, vocab)
    except GrammarError:
        assume(False)
        return
    matcher = Matcher(grammar)
    for data in prefill:
        if not matcher.accept_bytes(data):
            break
    for choice in [*choices, None]:
        mask = unpack_mask(matcher.mask(), len(vocab))
        assert mask.tolist() == literal_mask(matcher)
        allowed = np.flatnonzero(mask)
        if choice is None or allowed.size == 0 or not matcher.accept(int(allowed[choice % allowed.size])):
            break


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
