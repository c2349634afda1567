# Warming caches ahead of time, so that the first sessions on a vocabulary or grammar do not pay for them.
#
# Contract:
# - `warm_grammar(grammar, samples, seconds=...)` runs each sample text through a fresh `Matcher`, one code
#   point at a time (`accept_bytes`), and asks for the mask at every step; a sample stops at the first
#   character the grammar refuses, and the whole stops once `seconds` have passed. What it computes stays
#   in the grammar's caches and in the vocabulary's shared verdicts (masks/cache.py), and every later
#   grammar whose stack tops have the same structure (masks/structural_ids.py) finds it there.
# - `warm_vocabulary(vocab, seconds=...)` does so for llama-server's JSON mode over JSON_SAMPLES: the
#   string, number, literal and nesting rules every converted JSON schema repeats. A server warms each
#   vocabulary it registers; a benchmark counts it in the vocabulary's setup.
# - Warming never changes an answer: it fills caches that give the same masks cold.
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from constraintd.engine.chat.requests import json_object_grammar
from constraintd.engine.grammar.compiled import Grammar
from constraintd.engine.matcher import Matcher
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import LimitError

__all__ = ["JSON_SAMPLES", "WarmReport", "warm_grammar", "warm_vocabulary"]

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
    """Warm the verdicts JSON grammars share on `vocab`: JSON mode over JSON_SAMPLES."""
    return warm_grammar(Grammar.from_gbnf(json_object_grammar(), vocab), JSON_SAMPLES, seconds=seconds)
