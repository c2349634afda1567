"""Vocab.from_gguf against llama.cpp loading the same file: every piece, eog flag and token attribute,
and token_for_text against llama.cpp's tokenizer, for every vocabulary GGUF shipped with llama.cpp
and for Gemma 3 270M. Plus the refusals of files that are not usable vocabularies.

Sizes: all tokens of every vocabulary for pieces, eog flags and attributes (about 2.5 million tokens);
token_for_text on every special token and on up to 400 evenly spaced normal tokens per vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as ll
import pytest

from constraintd.engine.vocab import TokenAttr, Vocab
from constraintd.errors import VocabError
from tests import reference
from tests.conftest import OracleReport
from tests.oracle import LlamaVocab

GEMMA = "gemma-3-270m"
SUBJECTS = [*reference.vocab_names(), GEMMA]
NORMAL_SAMPLE = 400
SPECIAL = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)


@dataclass
class Loaded:
    """One vocabulary as we read it and as llama.cpp loads it (None when llama.cpp refuses it)."""

    name: str
    ours: Vocab
    llama: LlamaVocab


@pytest.fixture(scope="module", params=SUBJECTS, ids=SUBJECTS)
def loaded(request: pytest.FixtureRequest) -> Iterator[Loaded]:
    name: str = request.param
    path: Path = request.getfixturevalue("gemma_path") if name == GEMMA else reference.vocab_path(name)
    try:
        llama = LlamaVocab(path)
    except RuntimeError:
        with pytest.raises(VocabError):
            Vocab.from_gguf(path)
        pytest.skip(f"llama.cpp refuses {name}, and so do we")
    try:
        yield Loaded(name, Vocab.from_gguf(path), llama)
    finally:
        llama.close()


def llama_attrs(llama: LlamaVocab) -> list[int]:
    return [ll.llama_vocab_get_attr(llama.vocab, t) for t in range(llama.n_vocab)]


def llama_text(llama: LlamaVocab, token: int) -> bytes:
    text: bytes = ll.llama_vocab_get_text(llama.vocab, token)
    return text


def llama_single_token(llama: LlamaVocab, text: str) -> int | None:
    tokens = llama.tokenize(text.encode("utf-8", "surrogateescape"), add_special=False, parse_special=True)
    return tokens[0] if len(tokens) == 1 else None


@pytest.mark.oracle
def test_every_piece_is_llama_cpps(loaded: Loaded, oracle_report: OracleReport) -> None:
    theirs = loaded.llama.pieces()
    ours = loaded.ours.pieces
    assert len(ours) == len(theirs)
    different = [t for t in range(len(theirs)) if ours[t] != theirs[t]]
    oracle_report.add("pieces", loaded.name, identical=len(theirs) - len(different), total=len(theirs))
    assert not different, [(t, ours[t], theirs[t]) for t in different[:10]]


@pytest.mark.oracle
def test_every_eog_flag_is_llama_cpps(loaded: Loaded, oracle_report: OracleReport) -> None:
    n = loaded.llama.n_vocab
    theirs = [loaded.llama.is_eog(t) for t in range(n)]
    ours = [loaded.ours.is_eog(t) for t in range(n)]
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    oracle_report.add("eog flags", loaded.name, identical=same, total=n)
    assert loaded.ours.eog_ids == frozenset(t for t in range(n) if theirs[t])


@pytest.mark.oracle
def test_every_token_text_and_attribute_is_llama_cpps(loaded: Loaded, oracle_report: OracleReport) -> None:
    theirs = llama_attrs(loaded.llama)
    ours = loaded.ours.token_attrs
    texts = loaded.ours.token_texts
    assert ours is not None and texts is not None
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    oracle_report.add("token attributes", loaded.name, identical=same, total=len(theirs))
    assert list(ours) == theirs
    # texts: ctypes stops at NUL, so compare what precedes the first NUL
    sample = range(0, len(texts), max(1, len(texts) // 2000))
    assert [texts[t].encode("utf-8", "surrogateescape").split(b"\0")[0] for t in sample] == [
        llama_text(loaded.llama, t) for t in sample
    ]


@pytest.mark.oracle
def test_token_for_text_finds_every_special_token_as_llama_cpp(
    loaded: Loaded, oracle_report: OracleReport
) -> None:
    texts, attrs = loaded.ours.token_texts, loaded.ours.token_attrs
    assert texts is not None and attrs is not None
    specials = [t for t in range(len(texts)) if attrs[t] & SPECIAL]
    results = [
        (t, loaded.ours.token_for_text(texts[t]), llama_single_token(loaded.llama, texts[t]))
        for t in specials
    ]
    different = [r for r in results if r[1] != r[2]]
    oracle_report.add(
        "token_for_text special", loaded.name, identical=len(results) - len(different), total=len(results)
    )
    assert not different, [(texts[t], ours, theirs) for t, ours, theirs in different[:10]]


@pytest.mark.oracle
def test_token_for_text_on_normal_tokens(loaded: Loaded, oracle_report: OracleReport) -> None:
    # A sample of normal tokens, each written as its piece: what a grammar author would put in a
    # terminal. The plain-text lookup does not run the tokenizer (see Vocab.token_for_text): it may name
    # a token where llama.cpp makes several (counted in the report), but where llama.cpp makes exactly
    # one token it must name that one.
    attrs = loaded.ours.token_attrs
    assert attrs is not None
    normal = [t for t in range(len(attrs)) if attrs[t] & int(TokenAttr.NORMAL) and not attrs[t] & SPECIAL]
    sample = normal[:: max(1, len(normal) // NORMAL_SAMPLE)]
    texts = []
    for token in sample:
        try:
            texts.append(loaded.ours.piece(token).decode("utf-8"))
        except UnicodeDecodeError:
            continue  # a grammar's text is UTF-8; a partial character is no terminal
    results = [
        (text, loaded.ours.token_for_text(text), llama_single_token(loaded.llama, text)) for text in texts
    ]
    same = sum(ours == theirs for _, ours, theirs in results)
    oracle_report.add("token_for_text normal", loaded.name, identical=same, total=len(results))
    missed = [r for r in results if r[2] is not None and r[1] != r[2]]
    assert not missed, missed[:10]
    assert results
