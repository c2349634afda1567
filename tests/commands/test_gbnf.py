"""`constraintd gbnf` (constraintd/commands/gbnf.py), run in-process through `constraintd.cli.main`."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from constraintd.cli import main
from constraintd.engine.chat.requests import json_object_grammar
from constraintd.engine.schema.convert import convert_json_schema

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["gbnf", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, name: str, value: object) -> str:
    path = tmp_path / name
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return str(path)


def test_schema_file_prints_the_grammar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--schema", write(tmp_path, "s.json", PERSON)], capsys)
    assert (code, err) == (0, "")
    assert out == convert_json_schema(json.dumps(PERSON)).grammar


def test_schema_from_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO('{"type": "integer", "minimum": 2.0}'))
    code, out, _ = run(["--schema", "-"], capsys)
    assert code == 0
    assert out == convert_json_schema('{"type": "integer", "minimum": 2.0}').grammar


def test_the_report_goes_to_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Two patterns llama.cpp cannot translate (it accepts any string and says so), and a bound on a number.
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(?=a)b$"},
                                               "b": {"type": "string", "pattern": "x"},
                                               "c": {"type": "number", "minimum": 0}}}
    conversion = convert_json_schema(json.dumps(schema))
    assert len(conversion.warnings) == 2
    code, out, err = run(["--schema", write(tmp_path, "s.json", schema)], capsys)
    assert (code, out) == (0, conversion.grammar)
    assert err.splitlines() == [
        f"#/properties/a/pattern: pattern: {conversion.warnings[0]}",
        f"#/properties/b/pattern: pattern: {conversion.warnings[1]}",
        "#/properties/c/minimum: minimum: bounds on a non-integer number are not enforced",
    ]


def test_strict_refuses_the_first_unenforced_keyword(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    schema = {"type": "object", "properties": {"age": {"type": "number", "minimum": 0}, "tags": {
        "type": "array", "uniqueItems": True}}}
    path = write(tmp_path, "s.json", schema)
    code, out, err = run(["--schema", path, "--strict"], capsys)
    assert (code, out) == (2, "")
    assert err == ("constraintd gbnf: refused: strict: the grammar would not enforce minimum: bounds on a "
                   "non-integer number are not enforced (at #/properties/age/minimum)\n")


def test_strict_passes_a_schema_the_grammar_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--schema", write(tmp_path, "s.json", PERSON), "--strict"], capsys)
    assert (code, out, err) == (0, convert_json_schema(json.dumps(PERSON)).grammar, "")


def test_refused_schema_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--schema", write(tmp_path, "s.json", {"$ref": "#/$defs/missing"})], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("constraintd gbnf: refused: ") and "(at #" in err


def test_schema_not_json_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--schema", write(tmp_path, "s.json", "{not json")], capsys)
    assert (code, out) == (2, "")
    assert "refused" in err


def test_missing_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--schema", str(tmp_path / "absent.json")], capsys)
    assert (code, out) == (1, "")
    assert "cannot read" in err


@pytest.mark.parametrize(
    ("request_body", "expected"),
    [
        ({"messages": [], "response_format": {"type": "json_object"}}, "json_object"),
        ({"model": "m", "format": "json"}, "json_object"),
        ({"messages": [], "response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}},
         "person"),
        ({"model": "m", "format": PERSON}, "person"),
        ({"messages": [], "grammar": 'root ::= "yes" | "no"'}, 'root ::= "yes" | "no"'),
    ],
    ids=["openai json_object", "ollama json", "openai json_schema", "ollama schema", "grammar"],
)
def test_request_prints_its_grammar(request_body: object, expected: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    grammars = {"json_object": json_object_grammar(),
                "person": convert_json_schema(json.dumps(PERSON)).grammar}
    code, out, err = run(["--request", write(tmp_path, "r.json", request_body)], capsys)
    assert (code, err) == (0, "")
    grammar = grammars.get(expected, expected)
    assert out == (grammar if grammar.endswith("\n") else grammar + "\n")


def test_request_without_constraint_prints_nothing(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--request", write(tmp_path, "r.json", {"messages": []})], capsys)
    assert (code, out) == (0, "")
    assert "no constraint" in err


def test_conflicting_request_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    request_body = {"grammar": "root ::= [a]", "response_format": {"type": "json_object"}}
    code, out, err = run(["--request", write(tmp_path, "r.json", request_body)], capsys)
    assert (code, out) == (2, "")
    assert err == "constraintd gbnf: refused: Cannot use both response_format and grammar (at #/grammar)\n"


def test_request_report_points_into_the_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "number", "maximum": 3}}}
    request_body = {"messages": [], "response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "strict": True, "schema": schema}}}
    path = write(tmp_path, "r.json", request_body)
    code, out, err = run(["--request", path], capsys)  # the request's own strict is not acted on
    assert (code, out) == (0, convert_json_schema(json.dumps(schema)).grammar)
    pointer = "#/response_format/json_schema/schema/properties/n/maximum"
    assert err == f"{pointer}: maximum: bounds on a non-integer number are not enforced\n"
    code, out, err = run(["--request", path, "--strict"], capsys)
    assert (code, out) == (2, "")
    assert err.endswith(f"(at {pointer})\n")


@pytest.mark.parametrize("argv", [[], ["--schema", "a", "--request", "b"]], ids=["neither", "both"])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["gbnf", *argv])
    assert caught.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_dialect_extended(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema = {"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                               "n": {"type": "integer", "minimum": 100}}}
    path = write(tmp_path, "s.json", schema)
    code, out, err = run(["--schema", path, "--strict"], capsys)  # llama.cpp's grammar holds neither
    assert (code, out) == (2, "")
    code, out, err = run(["--schema", path, "--strict", "--dialect", "extended"], capsys)
    assert (code, err) == (0, "")
    assert out == convert_json_schema(json.dumps(schema), dialect="extended").grammar
    request_body = {"model": "m", "format": schema}
    code, out, err = run(["--request", write(tmp_path, "r.json", request_body), "--strict", "--dialect",
                          "extended"], capsys)
    assert (code, err) == (0, "")
    assert out == convert_json_schema(json.dumps(schema), dialect="extended").grammar


def test_an_unknown_dialect_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        run(["--schema", write(tmp_path, "s.json", PERSON), "--dialect", "xgrammar"], capsys)
    assert exited.value.code == 2
