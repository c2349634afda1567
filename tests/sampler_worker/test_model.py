"""sampler_worker.model: loading a GGUF, its logits, and the check that constraintd's vocabulary is
llama.cpp's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from constraintd.engine.vocab import Vocab
from sampler_worker.model import Model, ModelError, check_vocab


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Iterator[Model]:
    """Gemma 3 270M with a small context."""
    with Model(gemma_path, n_ctx=256, n_threads=2) as model:
        yield model


@pytest.fixture(scope="module")
def gemma_vocab(gemma_path: Path) -> Vocab:
    return Vocab.from_gguf(gemma_path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no such file"):
        Model(tmp_path / "absent.gguf")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not a file"):
        Model(tmp_path)


def test_not_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 a zip, not a model")
    with pytest.raises(ModelError, match="not a GGUF file"):
        Model(path)


@pytest.mark.slow
def test_truncated_gguf(tmp_path: Path, gemma_path: Path) -> None:
    path = tmp_path / "truncated.gguf"
    with gemma_path.open("rb") as whole:
        path.write_bytes(whole.read(4 << 20))
    with pytest.raises(ModelError, match="could not load"):
        Model(path)


@pytest.mark.slow
def test_progress_is_reported(gemma_path: Path) -> None:
    seen: list[float] = []
    with Model(gemma_path, n_ctx=64, progress=seen.append):
        pass
    assert seen and seen[-1] == 1.0
    assert seen == sorted(seen)


@pytest.mark.oracle
@pytest.mark.slow
def test_logits_are_llama_cpp_pythons(gemma: Model, gemma_path: Path) -> None:
    import llama_cpp

    prompt = gemma.tokenize("The capital of France is")
    gemma.reset()
    ours = [gemma.decode(prompt)] + [gemma.decode([token]) for token in (1234, 99)]
    # llama.cpp's default context (flash attention on, as llama-server runs) through the Llama class
    theirs_model = llama_cpp.Llama(
        model_path=str(gemma_path), n_ctx=256, n_threads=2, flash_attn=True, logits_all=True, verbose=False
    )
    theirs = []
    for tokens in (prompt, [1234], [99]):
        theirs_model.eval(tokens)
        theirs.append(np.array(theirs_model.scores[theirs_model.n_tokens - 1], dtype=np.float32))
    theirs_model.close()
    for mine, reference in zip(ours, theirs, strict=True):
        assert np.array_equal(mine, reference)


@pytest.mark.slow
def test_context_overflow_is_an_error(gemma: Model) -> None:
    gemma.reset()
    with pytest.raises(ModelError, match="context"):
        gemma.decode([2] * 300)
    gemma.reset()


def test_nothing_to_decode_is_an_error(gemma: Model) -> None:
    with pytest.raises(ModelError, match="nothing"):
        gemma.decode([])


def test_metadata(gemma: Model) -> None:
    assert gemma.n_vocab == 262_144
    assert gemma.add_bos
    assert gemma.bos_text == "<bos>"
    assert gemma.tokenize("hi", add_special=True)[0] == 2
    assert gemma.tokenize("<start_of_turn>", add_special=False, parse_special=True) == [105]
    assert gemma.is_eog(1) and gemma.is_eog(106) and not gemma.is_eog(2)
    assert gemma.suppress_tokens == ()  # the GGUF has no tokenizer.ggml.suppress_tokens
    assert gemma.chat_template is None  # nor a chat template: llama-server falls back to ChatML


@pytest.mark.oracle
@pytest.mark.slow
def test_constraintd_vocabulary_is_llama_cpps(gemma: Model, gemma_vocab: Vocab) -> None:
    check_vocab(gemma, gemma_vocab.pieces, gemma_vocab.eog_ids)


@pytest.mark.parametrize(
    ("change", "message"),
    [("size", "size differs"), ("piece", "token 300"), ("eog", "end-of-generation")],
    ids=["size", "piece", "eog"],
)
def test_vocabulary_differences_are_named(
    change: str, message: str, gemma: Model, gemma_vocab: Vocab
) -> None:
    pieces = list(gemma_vocab.pieces)
    eog = set(gemma_vocab.eog_ids)
    if change == "size":
        pieces.pop()
    elif change == "piece":
        pieces[300] += b"!"
    else:
        eog.add(5)
    with pytest.raises(ModelError, match=message):
        check_vocab(gemma, pieces, eog)
