"""The report against the JSON-Schema-Test-Suite: where it names nothing, the grammar refuses every instance
the suite says is invalid.

Workload: every test group of the suite (a schema exercising one keyword, with valid and invalid instances)
of drafts 4 to 2020-12, optional groups (formats, ...) included, read from the source distribution of
`jsonschema` that the schema corpus pins (downloaded into the reference cache by `python -m tests.reference
fetch`). Each invalid instance is written compactly and matched on its bytes by the engine's matcher. A group
whose schema's report is empty (so strict conversion takes it) and whose grammar takes an invalid instance
is a keyword the report misses. Valid instances a grammar refuses are llama.cpp's choices and not looked at.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from constraintd.engine import Grammar, GrammarError, Matcher, Vocab
from constraintd.engine.schema.convert import convert_json_schema
from constraintd.errors import ConstraintdError, SchemaError
from tests import reference
from tests.schema_corpus.assemble import PINS

DRAFTS: Final = ("draft2020-12", "draft2019-09", "draft7", "draft6", "draft4")
# Draft 7's optional groups validate contentMediaType / contentEncoding; 2020-12 makes the content
# vocabulary annotations, and so does the keyword table (keywords.py): those groups are not this test's.
ANNOTATED_HERE: Final = frozenset({"optional/content.json"})
BYTES: Final = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])


def suite_archive() -> Path:
    (pin,) = [pin for pin in PINS if pin.name == "jsonschema"]
    path = reference.cache_dir() / "schema-corpus" / "downloads" / f"jsonschema-{pin.version}.tar.gz"
    if not path.exists():
        pytest.skip(f"{path.name} is not in the reference cache (python -m tests.reference fetch)")
    return path


def groups(draft: str) -> Iterator[tuple[str, dict[str, object]]]:
    with tarfile.open(suite_archive()) as archive:
        for member in sorted(archive.getmembers(), key=lambda m: m.name):
            if f"/json/tests/{draft}/" in member.name and member.name.endswith(".json"):
                stream = archive.extractfile(member)
                assert stream is not None
                name = member.name.split(f"/{draft}/", 1)[1]
                if name in ANNOTATED_HERE:
                    continue
                for group in json.load(stream):
                    yield f"{name}: {group['description']}", group


def accepts(grammar: Grammar, text: str) -> bool:
    matcher = Matcher(grammar)
    try:
        return matcher.accept_bytes(text.encode()) and matcher.is_complete()
    except ConstraintdError:  # too many stacks: not taken
        return False


@pytest.mark.parametrize("draft", DRAFTS)
def test_an_empty_report_means_no_invalid_instance_passes(draft: str) -> None:
    clean = 0
    for name, group in groups(draft):
        text = json.dumps(group["schema"])
        try:
            conversion = convert_json_schema(text)
        except SchemaError:
            continue
        if conversion.unenforced:
            with pytest.raises(SchemaError):
                convert_json_schema(text, strict=True)
            continue
        try:
            grammar = Grammar.from_gbnf(conversion.grammar, BYTES)
        except GrammarError:
            continue
        clean += 1
        for test in group["tests"]:  # type: ignore[attr-defined]
            if not test["valid"]:
                instance = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
                assert not accepts(grammar, instance), f"{name} / {test['description']}: {instance[:100]}"
    assert clean > 50  # the suite has such groups in every draft
