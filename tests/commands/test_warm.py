"""`constraintd warm` (constraintd/commands/warm.py), run in-process through `constraintd.cli.main`: it
prepares a directory that a vocabulary store (and so `serve --cache-dir`) loads from."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from constraintd.cli import main
from constraintd.engine.vocab.vocab import Vocab
from constraintd.service.vocab_store import VocabStore
from tests import reference


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["warm", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_prepares_each_vocabulary_then_finds_it_prepared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spm, phi = reference.vocab_path("llama-spm"), reference.vocab_path("phi-3")
    cache = tmp_path / "cache"
    code, out, err = run(["--cache-dir", str(cache), "--vocab", str(spm), "--vocab", str(phi)], capsys)
    assert (code, out) == (0, "")
    assert err.count("read and prepared in") == 2, err
    assert len(list(cache.glob("vocab-*.npz"))) == len(list(cache.glob("gguf-*.link"))) == 2

    code, _, err = run(["--cache-dir", str(cache), "--vocab", str(spm)], capsys)
    assert code == 0 and "ggml-vocab-llama-spm.gguf: 32000 tokens, already prepared: loaded from" in err

    mounted = tmp_path / "models" / "model.gguf"  # the same model where a server finds it
    mounted.parent.mkdir()
    shutil.copyfile(spm, mounted)
    opened = VocabStore([cache]).open_gguf(mounted)
    assert opened.loaded_from is not None
    assert opened.vocab.content_hash == Vocab.from_gguf(spm).content_hash


def test_a_file_that_is_not_a_vocabulary_fails_but_the_others_are_prepared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    spm = reference.vocab_path("llama-spm")
    argv = ["--cache-dir", str(tmp_path / "cache"), "--vocab", str(junk), "--vocab", str(spm)]
    code, _, err = run(argv, capsys)
    assert code == 1
    assert "constraintd warm: " in err and "is not a GGUF file" in err
    assert "read and prepared in" in err


def test_a_cache_directory_that_cannot_be_written_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    code, _, err = run(
        ["--cache-dir", str(blocker / "cache"), "--vocab", str(reference.vocab_path("llama-spm"))], capsys
    )
    assert code == 1
    assert "not written" in err and "not saved in" in err


def test_the_cache_directory_and_a_vocabulary_are_required(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--vocab", "m.gguf"], ["--cache-dir", "cache"]):
        with pytest.raises(SystemExit) as exit_:
            main(["warm", *argv])
        assert exit_.value.code == 2
    assert "required" in capsys.readouterr().err
