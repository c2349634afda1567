"""Vocab built from lists: pieces, end-of-generation set, content hash, errors, token_for_text.

The GGUF reader and its comparison with llama.cpp are in test_gguf_vocab.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from constraintd.engine.vocab.vocab import TokenAttr, TokenizerRules, Vocab
from constraintd.errors import TokenError, VocabError

N, C, U = int(TokenAttr.NORMAL), int(TokenAttr.CONTROL), int(TokenAttr.USER_DEFINED)

PIECES = [b"<s>", b"</s>", b"a", b"b", b"ab", b" ab", b"", b"\x00x"]


def make_small() -> Vocab:
    return Vocab(PIECES, [1])


def test_pieces_and_eog_come_back_as_given() -> None:
    vocab = make_small()
    assert len(vocab) == len(PIECES)
    assert vocab.pieces == tuple(PIECES)
    assert [vocab.piece(t) for t in range(len(PIECES))] == PIECES
    assert vocab.eog_ids == frozenset({1})
    assert [t for t in range(len(vocab)) if vocab.is_eog(t)] == [1]
    assert vocab.model == ""
    assert vocab.token_texts is None


def test_eog_ids_may_be_numpy_integers() -> None:
    assert Vocab(PIECES, np.array([1, 3])).eog_ids == frozenset({1, 3})


def test_piece_lengths_are_the_byte_lengths_and_read_only() -> None:
    vocab = make_small()
    assert vocab.piece_lengths.tolist() == [len(p) for p in PIECES]
    with pytest.raises(ValueError, match="read-only"):
        vocab.piece_lengths[0] = 9


@pytest.mark.parametrize("token", [-1, len(PIECES), 10**9], ids=["negative", "one-past-end", "huge"])
def test_ids_outside_the_vocabulary_raise_token_error(token: int) -> None:
    vocab = make_small()
    with pytest.raises(TokenError, match="outside the vocabulary"):
        vocab.piece(token)
    with pytest.raises(TokenError, match="outside the vocabulary"):
        vocab.is_eog(token)


BAD_LISTS = [
    ([], (), {}, "at least one token"),
    ([b"a", "b"], (), {}, "token 1 is str, not bytes"),
    ([b"a"], (1,), {}, "outside the vocabulary"),
    ([b"a"], (-1,), {}, "outside the vocabulary"),
    ([b"a"], (0.0,), {}, "must be integers"),
    ([b"a", b"b"], (), {"token_texts": ["a"]}, "1 token texts for 2 pieces"),
    ([b"a"], (), {"token_attrs": [N]}, "need token texts"),
    ([b"a"], (), {"token_texts": ["a"], "token_attrs": [N, N]}, "2 token attributes for 1 pieces"),
]


@pytest.mark.parametrize(
    ("pieces", "eog", "options", "message"),
    BAD_LISTS,
    ids=[
        "empty",
        "str-piece",
        "eog-past-end",
        "eog-negative",
        "eog-float",
        "texts-count",
        "attrs-without-texts",
        "attrs-count",
    ],
)
def test_bad_lists_raise_vocab_error(
    pieces: list[bytes], eog: tuple[int, ...], options: dict[str, object], message: str
) -> None:
    with pytest.raises(VocabError, match=message):
        Vocab(pieces, eog, **options)  # type: ignore[arg-type]


def test_content_hash_is_stable_and_covers_every_part() -> None:
    base = Vocab(PIECES, [1])
    assert base.content_hash == Vocab(list(PIECES), (1,)).content_hash
    assert len(base.content_hash) == 64
    int(base.content_hash, 16)
    texts = [p.decode("latin-1") for p in PIECES]
    variants = {
        "piece": Vocab([*PIECES[:-1], b"\x00y"], [1]),
        "split": Vocab([b"<s></s>", b"", *PIECES[2:]], [1]),
        "eog": Vocab(PIECES, [0, 1]),
        "no-eog": Vocab(PIECES),
        "texts": Vocab(PIECES, [1], token_texts=texts),
        "attrs": Vocab(PIECES, [1], token_texts=texts, token_attrs=[N] * len(PIECES)),
        "tokenizer": Vocab(PIECES, [1], token_texts=texts, tokenizer=TokenizerRules("gpt2")),
    }
    hashes = {name: v.content_hash for name, v in variants.items()}
    assert base.content_hash not in hashes.values()
    assert len(set(hashes.values())) == len(hashes)


def test_content_hash_does_not_depend_on_the_process() -> None:
    # The hash names compiled grammars across processes: it must not use Python's randomised hash().
    import subprocess
    import sys

    code = "from constraintd.engine.vocab.vocab import Vocab; print(Vocab([b'a', b'bc'], [1]).content_hash)"
    runs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    }
    assert runs == {Vocab([b"a", b"bc"], [1]).content_hash + "\n"}


# A small vocabulary with special tokens, spelled like a byte-level BPE one ("Ġ" is the space byte).
BPE_TEXTS = [
    "<|endoftext|>",
    "<|im_end|>",
    "<tool>",
    "a",
    "b",
    "ab",
    "Ġab",
    "<",
    ">",
    "<ab>",
    "<|im",
    "Ġ<ab>",
]
BPE_ATTRS = [C, C, U, N, N, N, N, N, N, N, N, N]


def make_bpe() -> Vocab:
    pieces = [t.replace("Ġ", " ").encode() for t in BPE_TEXTS]
    return Vocab(
        pieces, [0, 1], token_texts=BPE_TEXTS, token_attrs=BPE_ATTRS, tokenizer=TokenizerRules("gpt2")
    )


TEXT_CASES = [
    ("<|im_end|>", 1),
    ("|im_end|", None),  # brackets are part of the text
    ("<|endoftext|>", 0),
    ("<tool>", 2),
    ("<ab>", 9),  # a plain token, spelled byte-level
    ("<|im_end|><|im_end|>", None),  # two special tokens
    ("<|im_end|> ", None),  # the special token, then a space
    ("", None),  # no token at all
    ("<b>", None),  # no such token
    ("< ab>", None),
]


@pytest.mark.parametrize(("text", "token"), TEXT_CASES, ids=[repr(t) for t, _ in TEXT_CASES])
def test_token_for_text_with_special_tokens(text: str, token: int | None) -> None:
    assert make_bpe().token_for_text(text) == token


def test_token_for_text_strips_whitespace_beside_lstrip_and_rstrip_tokens() -> None:
    texts = ["<x>", "<a", "b>", "<y>"]
    pieces = [t.encode() for t in texts]
    both = int(TokenAttr.USER_DEFINED | TokenAttr.LSTRIP | TokenAttr.RSTRIP)
    stripping = Vocab(pieces, token_texts=texts, token_attrs=[both, N, N, U])
    plain = Vocab(pieces, token_texts=texts, token_attrs=[U, N, N, U])
    assert stripping.token_for_text(" \t<x>\n ") == 0  # the whitespace goes with the token
    assert plain.token_for_text(" <x>") is None  # a space, then the token
    assert stripping.token_for_text("<a <x> b>") is None  # "<a", the token, "b>"
    assert stripping.token_for_text(" <y>") is None  # only LSTRIP tokens eat what is before them


def test_token_for_text_spm_spelling_adds_the_space_prefix() -> None:
    texts = ["<unk>", "<s>", "</s>", "<div>", "▁<div>", "▁<", "<"]
    attrs = [int(TokenAttr.UNKNOWN), C, C, N, N, N, N]
    pieces = [t.replace("▁", " ").encode() for t in texts]
    with_prefix = Vocab(
        pieces,
        [2],
        token_texts=texts,
        token_attrs=attrs,
        tokenizer=TokenizerRules("llama", add_space_prefix=True),
    )
    without = Vocab(pieces, [2], token_texts=texts, token_attrs=attrs, tokenizer=TokenizerRules("llama"))
    assert with_prefix.token_for_text("<div>") == 4
    assert without.token_for_text("<div>") == 3
    assert with_prefix.token_for_text("</s>") == 2
    assert with_prefix.token_for_text("<unk>") == 0


def test_token_for_text_without_tokenizer_matches_pieces() -> None:
    vocab = Vocab([b"<a>", b"<b>", b"<a>"])
    assert vocab.token_for_text("<a>") == 0  # the lowest id with that piece
    assert vocab.token_for_text("<b>") == 1
    assert vocab.token_for_text("b") is None
    assert vocab.token_for_text("<c>") is None
