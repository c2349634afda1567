"""sampler_worker.model: loading a GGUF, its logits, and the check that constraintd's vocabulary is
llama.cpp's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from constraintd.engine.vocab.vocab import Vocab
from sampler_worker.model import Model, ModelError, check_vocab, default_threads


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Iterator[Model]:
    """Gemma 3 270M with a small context."""
    with Model(gemma_path, n_ctx=256, n_threads=2) as model:
        yield model


@pytest.fixture(scope="module")
def gemma_vocab(gemma_path: Path) -> Vocab:
    return Vocab.from_gguf(gemma_path)


def fake_cpus(root: Path, siblings: list[str]) -> Path:
    """A /sys/devices/system/cpu with one thread_siblings file per logical CPU."""
    for cpu, mask in enumerate(siblings):
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings").write_text(mask + "\n")
    return root


# (thread siblings per logical CPU, cgroup cpu.max or None, affinity, threads): llama.cpp's physical
# core count, bounded by the affinity and the quota
THREAD_CASES = [
    (["3", "3", "c", "c"], None, {0, 1, 2, 3}, 2),  # two cores with two hyper-threads each
    (["1", "2", "4", "8"], None, {0, 1, 2, 3}, 4),  # four cores, no hyper-threads
    (["1", "2", "4", "8"], "max 100000", {0, 1, 2, 3}, 4),  # no quota
    (["1", "2", "4", "8"], "150000 100000", {0, 1, 2, 3}, 2),  # 1.5 CPUs of quota: 2 threads
    (["1", "2", "4", "8"], "50000 100000", {0, 1, 2, 3}, 1),
    (["1", "2", "4", "8"], None, {2}, 1),  # pinned to one CPU
]


@pytest.mark.parametrize(
    ("siblings", "cpu_max", "affinity", "threads"), THREAD_CASES,
    ids=["hyper-threads", "cores", "no-quota", "quota-1.5", "quota-0.5", "affinity"],
)
def test_default_threads(
    tmp_path: Path, siblings: list[str], cpu_max: str | None, affinity: set[int], threads: int
) -> None:
    cgroup = tmp_path / "cpu.max"
    if cpu_max is not None:
        cgroup.write_text(cpu_max + "\n")
    sys_cpu = fake_cpus(tmp_path / "cpu", siblings)
    assert default_threads(sys_cpu=sys_cpu, cgroup_cpu_max=cgroup, affinity=affinity) == threads


def test_default_threads_without_topology_follow_llama_cpp(tmp_path: Path) -> None:
    # no topology to read: llama.cpp takes the logical CPUs up to four, else half of them
    logical = os.cpu_count() or 1
    expected = logical if logical <= 4 else logical // 2
    assert default_threads(sys_cpu=tmp_path, cgroup_cpu_max=tmp_path / "none", affinity=set()) == expected


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
def test_truncated_context_decodes_as_before(gemma: Model) -> None:
    prompt = gemma.tokenize("Three colours of the sky:")
    gemma.reset()
    gemma.decode(prompt)
    first = [gemma.decode([token]) for token in (4_021, 17)]
    gemma.truncate(len(prompt))
    assert gemma.n_past == len(prompt)
    again = [gemma.decode([token]) for token in (4_021, 17)]
    for before, after in zip(first, again, strict=True):
        assert np.array_equal(before, after)


@pytest.mark.parametrize("keep", [-1, 1_000], ids=["negative", "past-the-end"])
def test_truncating_outside_the_context_is_an_error(gemma: Model, keep: int) -> None:
    with pytest.raises(ModelError, match="cannot keep"):
        gemma.truncate(keep)


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
