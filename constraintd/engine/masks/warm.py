# Warming caches ahead of time, so that the first sessions on a vocabulary or grammar do not pay for them.
#
# Contract:
# - `warm_grammar(grammar, samples, seconds=...)` runs each sample text through a fresh `Matcher`, one code
#   point at a time (`accept_bytes`), and asks for the mask at every step; a sample stops at the first
#   character the grammar refuses, and the whole stops once `seconds` have passed. What it computes stays
#   in the grammar's caches and in the vocabulary's shared verdicts (masks/cache.py), and every later
#   grammar whose stack tops have the same structure (masks/structural_ids.py) finds it there.
# - `warm_vocabulary(vocab, seconds=...)` does so for llama-server's JSON mode over JSON_SAMPLES (the
#   string, number, literal and nesting rules every converted JSON schema repeats), then for the grammar
#   llama.cpp's converter makes of SCHEMA_WARMUP over SCHEMA_SAMPLES: the shapes converted schemas add
#   (the first character of a `char+` string is a position of its own, whose verdict is a walk of every
#   string token: 17 ms on qwen2, met by the first schema with `minLength: 1`), within one time limit.
#   A server warms each vocabulary it registers; a benchmark counts it in the vocabulary's setup.
# - Warming never changes an answer: it fills caches that give the same masks cold.
from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from constraintd.engine.chat.requests import json_object_grammar
from constraintd.engine.grammar.compiled import Grammar
from constraintd.engine.matcher import Matcher
from constraintd.engine.schema.convert import json_schema_to_gbnf
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import LimitError

__all__ = ["JSON_SAMPLES", "SCHEMA_SAMPLES", "SCHEMA_WARMUP", "WarmReport", "warm_grammar", "warm_vocabulary"]

# JSON texts that go through the contexts converted schemas share: keys and string values with escapes
# and non-ASCII text, integers and decimals with exponents, literals, nested arrays and objects, and the
# whitespace the `space` rule allows.
JSON_SAMPLES: Final = (
    '{"name": "Ada Lovelace", "id": 1815, "score": -12.5e-3, "ok": true, "none": null}',
    '{"text": "line\\nbreak \\"quoted\\" \\\\ \\u00e9t\\u00e9 caf\u00e9 \u4e2d\u6587 \U0001f600", "n": 0}',
    '{"list": [1, 2.0, -3E+2, "x", false, [], {}], "nested": {"a": {"b": [{"c": ""}]}}}',
    '{\n  "pretty": [\n    10,\n    "twenty"\n  ],\n  "empty": ""\n}',
    '{"date": "2024-01-31T12:00:00Z", "url": "https://example.com/a?b=c&d=e", "tag": "#x"}',
)

# A JSON schema whose converted grammar holds the shapes converted schemas repeat beyond JSON mode's rules:
# strings of at least one character (`char+`) and of bounded length (`char{m,n}`), integers, an enum, the
# date, time and uuid formats, arrays of strings and of integers, nested and free-form objects.
SCHEMA_WARMUP: Final = json.dumps(
    {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "id": {"type": "string", "minLength": 1},
            "code": {"type": "string", "minLength": 2, "maxLength": 8},
            "note": {"type": "string", "maxLength": 64},
            "count": {"type": "integer"},
            "score": {"type": "number"},
            "ok": {"type": "boolean"},
            "none": {"type": "null"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "ids": {"type": "array", "items": {"type": "integer"}},
            "kind": {"type": "string", "enum": ["alpha", "beta"]},
            "when": {"type": "string", "format": "date-time"},
            "day": {"type": "string", "format": "date"},
            "uuid": {"type": "string", "format": "uuid"},
            "meta": {
                "type": "object",
                "properties": {"key": {"type": "string"}, "value": {"type": "number"}},
                "required": ["key"],
                "additionalProperties": True,
            },
            "extra": {"type": "object"},
        },
        "required": ["name", "id"],
    }
)
_SCHEMA_DOCUMENT: Final = {
    "name": "Ada Lovelace",
    "id": "x-1815",
    "code": "AB12",
    "note": 'line\nbreak "quoted" caf\u00e9 \u4e2d',
    "count": -42,
    "score": 12.5e-3,
    "ok": True,
    "none": None,
    "tags": ["a", "b c", ""],
    "ids": [1, 20],
    "kind": "beta",
    "when": "2024-01-31T12:00:00Z",
    "day": "2024-02-29",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
    "meta": {"key": "k", "value": 0.5, "unit": "m", "k2": 1},
    "extra": {"any": [1, {"x": "y"}], "b": False},
}
# documents of SCHEMA_WARMUP, compact (as a model usually writes them) and with spaces
SCHEMA_SAMPLES: Final = (
    json.dumps(_SCHEMA_DOCUMENT, separators=(",", ":"), ensure_ascii=False),
    json.dumps(_SCHEMA_DOCUMENT, ensure_ascii=False),
    json.dumps({"name": "", "id": "7", "tags": [], "meta": {"key": "a b"}}, separators=(",", ":")),
)


@dataclass(frozen=True, slots=True)
class WarmReport:
    """What a warm-up did.

    Attributes:
        masks: masks computed (or found already cached).
        verdicts: stack-top verdicts the vocabulary keeps after it.
        verdict_bytes: their arrays' bytes.
        seconds: how long it took.
        complete: False when it stopped on its time limit.
    """

    masks: int
    verdicts: int
    verdict_bytes: int
    seconds: float
    complete: bool


def warm_grammar(grammar: Grammar, samples: Iterable[str], *, seconds: float = 30.0) -> WarmReport:
    """Compute the masks along each sample text (see the module comment); a sample that meets the stack
    limit is left where it met it."""
    started = time.monotonic()
    deadline = started + seconds
    masks = 0
    complete = True
    for sample in samples:
        matcher = Matcher(grammar)
        try:
            matcher.mask()
            masks += 1
            for char in sample:
                if time.monotonic() > deadline:
                    complete = False
                    break
                if not matcher.accept_bytes(char.encode("utf-8")):
                    break
                matcher.mask()
                masks += 1
        except LimitError:
            continue
        if not complete:
            break
    shared = grammar._masks.shared
    return WarmReport(masks, len(shared), shared.nbytes, time.monotonic() - started, complete)


def warm_vocabulary(vocab: Vocab, *, seconds: float = 60.0) -> WarmReport:
    """Warm the verdicts JSON grammars share on `vocab`: JSON mode over JSON_SAMPLES, then the converted
    SCHEMA_WARMUP over SCHEMA_SAMPLES, in `seconds` in all."""
    started = time.monotonic()
    json_mode = warm_grammar(Grammar.from_gbnf(json_object_grammar(), vocab), JSON_SAMPLES, seconds=seconds)
    left = max(seconds - (time.monotonic() - started), 0.0)
    schema = Grammar.from_gbnf(json_schema_to_gbnf(SCHEMA_WARMUP), vocab)
    converted = warm_grammar(schema, SCHEMA_SAMPLES, seconds=left)
    return WarmReport(
        json_mode.masks + converted.masks,
        converted.verdicts,
        converted.verdict_bytes,
        time.monotonic() - started,
        json_mode.complete and converted.complete,
    )
