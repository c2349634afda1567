"""`constraintd check` (constraintd/commands/check.py), run in-process through `constraintd.cli.main`."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from constraintd.cli import main
from tests import reference

GRAMMAR = """\
root ::= "{" ws pair ("," ws pair)* "}"
pair ::= "\\"" [a-z]+ "\\"" ws ":" ws [0-9]+ ws
ws ::= [ \\n]*
"""


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def grammar_file(tmp_path: Path) -> str:
    path = tmp_path / "g.gbnf"
    path.write_text(GRAMMAR)
    return str(path)


def test_accepted_and_complete(grammar_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--grammar", grammar_file, '{"a": 1}'], capsys) == (0, "accepted: complete\n", "")


def test_accepted_but_incomplete(grammar_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--grammar", grammar_file, '{"a": 1'], capsys)
    assert code == 3
    assert out.startswith("accepted: incomplete")
    assert "'}'" in out and "','" in out


def test_rejected_says_where(grammar_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--grammar", grammar_file, '{"a": 1,\n "é": 2}'], capsys)
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "rejected at byte 11 (line 2, column 3): 'é' is not allowed here"
    assert lines[1:3] == ['   "é": 2}', "    ^"]
    assert lines[3].startswith("  expected: 'a', 'b'")


def test_rejected_at_the_end(grammar_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--grammar", grammar_file, '{"a":1}x'], capsys)
    assert code == 1
    assert out.splitlines()[-1] == "  expected: the end of the text"


@pytest.mark.parametrize(
    ("text", "offset"),
    [(b'{"a":\xff}', 5), (b'{"a\xe4":1}', 3), (b'{"a":1\x00}', 6)],
    ids=["ff", "cut", "nul"],
)
def test_bytes_that_never_match(
    text: bytes,
    offset: int,
    grammar_file: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text)))
    code, out, _ = run(["--grammar", grammar_file, "-"], capsys)
    assert code == 1
    assert out.startswith(f"rejected at byte {offset} ")


def test_text_from_stdin_by_default(
    grammar_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b'{"b":2}')))
    assert run(["--grammar", grammar_file], capsys)[0] == 0


def test_another_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.gbnf"
    path.write_text('root ::= "a"\nother ::= "b"\n')
    assert run(["--grammar", str(path), "--root", "other", "b"], capsys)[0] == 0
    assert run(["--grammar", str(path), "--root", "missing", "b"], capsys)[0] == 2


def test_a_refused_grammar_exits_2_with_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.gbnf"
    path.write_text('root ::= "a"\nx ::= "b" @\n')
    code, out, err = run(["--grammar", str(path), "a"], capsys)
    assert (code, out) == (2, "")
    assert "line 2" in err


def test_a_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--grammar", str(tmp_path / "none.gbnf"), "a"], capsys)[0] == 2


def test_token_terminals_need_the_vocabulary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.gbnf"
    path.write_text('root ::= "hi" <|im_end|>\n')
    assert run(["--grammar", str(path), "hi"], capsys)[0] == 2  # no such token without a vocabulary
    qwen2 = reference.vocab_path("qwen2")
    if not qwen2.exists():
        pytest.skip(f"{qwen2} is missing")
    code, out, _ = run(["--grammar", str(path), "--vocab", str(qwen2), "hi"], capsys)
    assert (code, out.splitlines()[0]) == (3, "accepted: incomplete (the grammar expects more)")
