"""One schema text through llama.cpp (the harness) and through constraintd, and how the answers compare.

Verdicts:
- "identical": the same grammar bytes and the same warnings, or a refusal with the same message (for text
  that is not JSON at all: both refuse, messages differ by design);
- "crash-refused": llama.cpp crashed or never answered, constraintd refused with a SchemaError (the design);
- "utf8-refused": llama.cpp returned a grammar that is not valid UTF-8, constraintd refused (the design);
- "different": anything else; the detail says what.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from constraintd.engine.schema.convert import convert_json_schema
from constraintd.errors import SchemaError
from tests.schema_oracle.build import run_harness

EXPECTED_VERDICTS = frozenset({"identical", "crash-refused", "utf8-refused"})


@dataclass(frozen=True, slots=True)
class Comparison:
    verdict: str
    detail: str = ""


def _ours(schema_text: str) -> tuple[str, str, str]:
    """("grammar", text, warnings) or ("refused", reason, "")."""
    try:
        conversion = convert_json_schema(schema_text)
    except SchemaError as err:
        return "refused", err.reason, ""
    return "grammar", conversion.grammar, "; ".join(conversion.warnings)


def compare_conversion(binary: Path, schema_text: str) -> Comparison:
    """Convert `schema_text` both ways and judge the two answers."""
    kind, text, warnings = _ours(schema_text)
    theirs = run_harness(binary, schema_text.encode("utf-8"))
    if theirs.crashed:
        if kind == "refused":
            return Comparison("crash-refused")
        return Comparison("different", f"llama.cpp crashed ({theirs.code}), we answered a grammar")
    if theirs.code == 3:  # not JSON
        if kind == "refused" and text.startswith("invalid JSON"):
            return Comparison("identical")
        return Comparison("different", f"llama.cpp: not JSON ({theirs.out!r}); we: {kind} {text!r}")
    if theirs.code == 2:
        message = theirs.out.decode("utf-8", "replace")
        if kind == "refused" and text == message:
            return Comparison("identical")
        return Comparison("different", f"llama.cpp refused: {message!r}\nwe: {kind} {text!r}")
    try:
        grammar = theirs.out.decode("utf-8")
    except UnicodeDecodeError:
        if kind == "refused" and "not valid UTF-8" in text:
            return Comparison("utf8-refused")
        return Comparison("different", f"llama.cpp's grammar is not UTF-8; we: {kind} {text!r}")
    if kind != "grammar":
        return Comparison("different", f"llama.cpp converted, we refused: {text!r}\nllama.cpp:\n{grammar}")
    if text != grammar:
        return Comparison("different", f"grammars differ\nllama.cpp:\n{grammar}\nwe:\n{text}")
    if warnings != theirs.warnings:
        return Comparison("different", f"warnings differ\nllama.cpp: {theirs.warnings!r}\nwe: {warnings!r}")
    return Comparison("identical")
