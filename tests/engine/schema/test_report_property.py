"""The report's promise as a property: for a schema whose report is empty, every text its grammar produces
is a JSON document the schema accepts.

Schemas come from the schema oracle's strategies (rough on purpose: odd names, bounds, patterns, `$ref`s);
texts are drawn from the grammar itself, one ASCII byte at a time among those the engine's mask allows, and
judged by a validator of JSON Schema 2020-12 (`jsonschema`, with its format checks).
"""

from __future__ import annotations

import json
import random
import re
import warnings
from typing import Any, Final

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.schema.convert import convert_json_schema
from constraintd.errors import ConstraintdError, SchemaError
from tests.schema_oracle.strategies import schema_documents

jsonschema = pytest.importorskip("jsonschema")

BYTES: Final = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])
MAX_BYTES: Final = 120
TEXTS_PER_SCHEMA: Final = 5


def draw_text(grammar: Grammar, rng: random.Random) -> bytes | None:
    """A text the grammar takes to its end, drawn byte by byte (ASCII), or None when none ends in time."""
    matcher = Matcher(grammar)
    text = bytearray()
    for _ in range(MAX_BYTES):
        bits = np.unpackbits(matcher.mask().view(np.uint8), bitorder="little")[:256]
        allowed = [int(token) for token in np.flatnonzero(bits)]
        if 0 in allowed and (len(allowed) == 1 or rng.random() < 0.3):  # end of generation
            return bytes(text)
        ascii_bytes = [token for token in allowed if 0 < token < 0x80]
        if not ascii_bytes:
            return None
        token = rng.choice(ascii_bytes)
        assert matcher.accept(token)
        text.append(token)
    return None


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema_documents(), st.randoms(use_true_random=False))
def test_what_a_fully_enforced_grammar_produces_is_valid(schema: dict[str, Any], rng: random.Random) -> None:
    try:
        conversion = convert_json_schema(json.dumps(schema))
        if conversion.unenforced:
            return
        grammar = Grammar.from_gbnf(conversion.grammar, BYTES)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            jsonschema.Draft202012Validator.check_schema(schema)  # the validator judges valid schemas only
        validator = jsonschema.Draft202012Validator(
            schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )
    except (SchemaError, ConstraintdError, jsonschema.exceptions.SchemaError):
        return
    for _ in range(TEXTS_PER_SCHEMA):
        text = draw_text(grammar, rng)
        if text is None:
            continue
        document = json.loads(text)  # not JSON: a failure too
        verdict = judge(validator, document)
        assert verdict is not False, f"{text!r} is not valid for {json.dumps(schema)[:300]}"


def judge(validator: Any, document: object) -> bool | None:
    """The validator's verdict; None where Python's regular expressions cannot read a `pattern`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # Python's re on patterns such as `[[a-z]`
        try:
            return bool(validator.is_valid(document))
        except re.error:
            return None
