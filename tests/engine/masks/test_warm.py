"""Warming: caches filled ahead of time, the same masks afterwards."""

from __future__ import annotations

import json

import numpy as np

from constraintd.engine import Grammar, Matcher, Vocab, json_object_grammar
from constraintd.engine.masks.compute import compute_mask
from constraintd.engine.masks.verdicts import SHIFT_MARK
from constraintd.engine.masks.warm import (
    JSON_SAMPLES,
    SCHEMA_SAMPLES,
    SCHEMA_WARMUP,
    warm_grammar,
    warm_vocabulary,
)
from constraintd.engine.schema.convert import json_schema_to_gbnf

PIECES = [b"</s>", b"{", b"}", b'"', b'{"', b'":', b" ", b"a", b"ab", b"1", b"12", b",", b"e", b'"}']
PIECES.append("é".encode())


def test_warming_fills_the_caches_and_changes_no_mask() -> None:
    vocab = Vocab(PIECES, eog_ids=[0])
    grammar = Grammar.from_gbnf(json_object_grammar(), vocab)
    report = warm_grammar(grammar, ['{"ab": 12, "a": "é"}'])
    assert report.complete and report.masks == len('{"ab": 12, "a": "é"}') + 1
    assert report.verdicts == len(vocab.decoded().verdicts()) > 0
    assert len(grammar._masks) > 0
    matcher = Matcher(grammar)
    for token in (1, 3, 8, 5, 6, 10, 11):  # {"ab": 12,
        state = grammar._states.intern(matcher.stacks, 10**6)
        walked = compute_mask(state, matcher.partial_utf8, grammar._decoded, 10**6)
        assert np.array_equal(matcher.mask(), walked)
        assert matcher.accept(token)


def test_a_sample_the_grammar_refuses_stops_there_and_time_is_bounded() -> None:
    vocab = Vocab(PIECES, eog_ids=[0])
    grammar = Grammar.from_gbnf(json_object_grammar(), vocab)
    refused = warm_grammar(grammar, ["[1]", '{"a"'])
    assert refused.masks == 1 + len('{"a"') + 1  # "[" refused at once; the second sample walks to its end
    assert not warm_grammar(grammar, JSON_SAMPLES, seconds=0.0).complete


def test_the_json_samples_are_json_mode_documents() -> None:
    vocab = Vocab(PIECES, eog_ids=[0])
    report = warm_vocabulary(vocab)
    assert report.complete
    # every sample walked to its end: JSON mode's, then the converted schema's
    assert report.masks == sum(len(sample) + 1 for sample in (*JSON_SAMPLES, *SCHEMA_SAMPLES))


def test_the_schema_samples_are_whole_documents_of_the_converted_schema() -> None:
    grammar = Grammar.from_gbnf(json_schema_to_gbnf(SCHEMA_WARMUP), Vocab(PIECES, eog_ids=[0]))
    for sample in SCHEMA_SAMPLES:
        matcher = Matcher(grammar)
        assert all(matcher.accept_bytes(char.encode("utf-8")) for char in sample), sample
        assert matcher.is_complete(), sample


def test_a_key_trie_after_the_warm_up_finds_what_a_keys_rest_does() -> None:
    # An object with properties and other keys: llama.cpp's converter writes the other keys as a trie
    # (`[^"a] char*`, ...), whose classes all leave one stack. The warm-up's own trie has left what that
    # stack does with a token's rest (masks/cache.py's shifted verdicts), for every later schema.
    vocab = Vocab(PIECES, eog_ids=[0])
    warm_vocabulary(vocab)
    schema = {"type": "object", "properties": {"ab": {"type": "integer"}}, "additionalProperties": True}
    grammar = Grammar.from_gbnf(json_schema_to_gbnf(json.dumps(schema)), vocab)
    Matcher(grammar).mask()  # the grammar's structural ids exist from its first mask on
    rules = grammar._states.rules
    (other_keys,) = [pos for pos, cls in enumerate(rules.classes) if cls == (False, ((34, 34), (97, 97)))]
    structure = grammar._masks.structure
    assert structure is not None
    key = (SHIFT_MARK, *structure.stack((rules.escape, rules.after[other_keys])))
    assert vocab.decoded().verdicts().shifted.peek(key) is not None
