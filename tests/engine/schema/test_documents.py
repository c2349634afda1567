"""Real schemas and their example documents, end to end: the converter's grammar parses in the engine, and
the engine's matcher accepts each document exactly where llama.cpp's grammar sampler does.

Workload: every schema of the MaskBench sample (tests/vectors/maskbench-sample, 264 schemas with about
1,000 example documents, valid and invalid), each document written compactly and indented by two spaces,
tokenized by llama.cpp with the qwen2 vocabulary and fed token by token to both. Per token, llama.cpp is
asked about that token alone (its sampler applied to a one-candidate array), so the walk costs
microseconds, not a whole-vocabulary mask. Compared: the verdict at every token up to and including the
first rejection, and at the end whether the end-of-generation token is allowed.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from constraintd.engine import Grammar, GrammarError, Matcher, Vocab
from constraintd.engine.schema.convert import json_schema_to_gbnf
from constraintd.errors import SchemaError
from tests import reference
from tests.conftest import OracleReport

ll = pytest.importorskip("llama_cpp")
from tests.oracle import LlamaGrammar, LlamaVocab  # noqa: E402

pytestmark = pytest.mark.oracle

SAMPLE = Path(__file__).resolve().parents[2] / "vectors" / "maskbench-sample"
SCHEMAS = sorted(SAMPLE.glob("*.json"))

_ONE = np.zeros(1, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def llama_allows(grammar: LlamaGrammar, token: int) -> bool:
    """llama.cpp's verdict on one token: its grammar sampler applied to an array holding only that token."""
    _ONE["id"] = token
    _ONE["logit"] = 0.0
    array = ll.llama_token_data_array(
        data=_ONE.ctypes.data_as(ll.llama_token_data_p), size=1, selected=-1, sorted=False
    )
    ll.llama_sampler_apply(grammar.sampler, ctypes.byref(array))
    return bool(np.isfinite(_ONE["logit"][0]))


@pytest.fixture(scope="module")
def llama_qwen2() -> Iterator[LlamaVocab]:
    with LlamaVocab(reference.require(reference.vocab_path("qwen2"))) as vocab:
        yield vocab


@pytest.fixture(scope="module")
def qwen2() -> Vocab:
    return Vocab.from_gguf(reference.require(reference.vocab_path("qwen2")))


def layouts(data: object) -> dict[str, str]:
    return {
        "compact": json.dumps(data, separators=(",", ":"), ensure_ascii=False),
        "indented": json.dumps(data, indent=2, ensure_ascii=False),
    }


def walk_ours(grammar: Grammar, tokens: list[int]) -> tuple[list[bool], bool]:
    matcher = Matcher(grammar)
    verdicts = []
    for token in tokens:
        verdicts.append(matcher.accept(token))
        if not verdicts[-1]:
            return verdicts, False
    return verdicts, matcher.is_complete()


def walk_llama(vocab: LlamaVocab, gbnf: str, tokens: list[int], eog: int) -> tuple[list[bool], bool]:
    grammar = LlamaGrammar.create(vocab, gbnf)
    assert grammar is not None
    with grammar:
        verdicts = []
        for token in tokens:
            verdicts.append(llama_allows(grammar, token))
            if not verdicts[-1]:
                return verdicts, False
            grammar.accept(token)
        return verdicts, llama_allows(grammar, eog)


@pytest.mark.parametrize("path", SCHEMAS, ids=lambda p: p.stem)
def test_documents_accepted_as_llama_cpp_accepts_them(
    path: Path, qwen2: Vocab, llama_qwen2: LlamaVocab, oracle_report: OracleReport
) -> None:
    case = json.loads(path.read_text())
    try:
        gbnf = json_schema_to_gbnf(json.dumps(case["schema"]))
    except SchemaError:
        pytest.skip("the converter refuses this schema (its own tests compare the refusal with llama.cpp)")
    try:
        grammar = Grammar.from_gbnf(gbnf, qwen2)
    except GrammarError:
        # llama.cpp's parser must refuse it too (a NUL in a pattern, a repetition over its limit)
        assert LlamaGrammar.create(llama_qwen2, gbnf) is None
        oracle_report.add("schema grammars refused", "maskbench-sample", identical=1, total=1)
        return
    (eog,) = sorted(qwen2.eog_ids)[:1]
    identical = total = 0
    for document in case["tests"]:
        for layout, text in layouts(document["data"]).items():
            tokens = llama_qwen2.tokenize(text.encode())
            ours = walk_ours(grammar, tokens)
            theirs = walk_llama(llama_qwen2, gbnf, tokens, eog)
            total += 1
            identical += ours == theirs
            assert ours == theirs, f"{layout} document {text[:80]!r}: ours {ours}, llama.cpp {theirs}"
    oracle_report.add("schema documents", "maskbench-sample/qwen2", identical=identical, total=total)
