"""The report on real schemas: where it names nothing, the grammar refuses every document the schema forbids.

Workload: the MaskBench sample (tests/vectors/maskbench-sample) with its invalid example documents, each
written compactly and indented, matched on its raw bytes by the engine's matcher. A schema whose report is
empty (so strict conversion takes it) whose grammar takes an invalid document is a keyword the report
misses. Documents a grammar refuses although valid are llama.cpp's choices (closed objects, ...), not a
gap of the report, and are not looked at here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

import pytest

from constraintd.engine import Grammar, GrammarError, Matcher, Vocab
from constraintd.engine.schema.convert import convert_json_schema
from constraintd.errors import SchemaError

SAMPLE: Final = Path(__file__).resolve().parents[2] / "vectors" / "maskbench-sample"
SCHEMAS: Final = sorted(SAMPLE.glob("*.json"))
BYTES: Final = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])


def accepts(grammar: Grammar, text: str) -> bool:
    matcher = Matcher(grammar)
    return matcher.accept_bytes(text.encode()) and matcher.is_complete()


@pytest.mark.parametrize("path", SCHEMAS, ids=lambda p: p.stem)
def test_an_empty_report_means_no_invalid_document_passes(path: Path) -> None:
    case = json.loads(path.read_text())
    try:
        conversion = convert_json_schema(json.dumps(case["schema"]))
    except SchemaError:
        pytest.skip("the converter refuses this schema")
    if conversion.unenforced:
        with pytest.raises(SchemaError):
            convert_json_schema(json.dumps(case["schema"]), strict=True)
        return
    try:
        grammar = Grammar.from_gbnf(conversion.grammar, BYTES)
    except GrammarError:
        pytest.skip("the engine refuses this grammar, as llama.cpp does")
    for document in case["tests"]:
        if document["valid"]:
            continue
        for text in (json.dumps(document["data"], separators=(",", ":"), ensure_ascii=False),
                     json.dumps(document["data"], indent=2, ensure_ascii=False)):
            assert not accepts(grammar, text), f"invalid document taken, report empty: {text[:200]}"
