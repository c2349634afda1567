"""One llama.cpp context of n sequences decoded together: every generation goes on within its grammar, the
steps wait only for active sequences, a failure reaches only its own sequence, released cells are gone."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clients import Client
from sampler_worker.chain import SamplerSettings
from sampler_worker.generate import Generation, generate
from sampler_worker.model import Model, ModelError
from sampler_worker.serve.contexts import BatchedSequence, contexts

SLOTS = 3
N_CTX = 256
GRAMMAR = 'root ::= "Answer: " [0-9]+ "."'
PROMPTS = ("What is 6 times 7? Answer:", "The capital of France is", "1, 2, 3, 4,")


@pytest.fixture(scope="module")
def model(gemma_path: Path) -> Iterator[Model]:
    with Model(gemma_path, n_ctx=N_CTX, n_threads=2) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def slots(model: Model) -> Iterator[list[BatchedSequence]]:
    made = contexts(model, SLOTS, threads=2)
    assert all(isinstance(slot, BatchedSequence) for slot in made)
    yield made  # type: ignore[misc]
    for slot in made:
        slot.close()


def cells(slot: BatchedSequence) -> int:
    """The highest position the sequence holds in the KV cache (-1: none)."""
    owner = slot._owner
    return int(slot._ll.llama_memory_seq_pos_max(owner._memory, slot.seq))


def at_once(work: list[Callable[[], object]]) -> list[object]:
    """Run each on a thread of its own, all at once; what each returned or raised."""
    got: list[object] = [None] * len(work)

    def run(i: int) -> None:
        try:
            got[i] = work[i]()
        except Exception as exc:  # the test looks at it
            got[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads)
    return got


def released(slot: BatchedSequence, call: Callable[[], object]) -> Callable[[], object]:
    def work() -> object:
        try:
            return call()
        finally:
            slot.release()

    return work


def test_one_slot_is_the_model_itself(model: Model) -> None:
    assert contexts(model, 1, threads=2) == [model]


@pytest.mark.slow
def test_each_sequence_has_the_model_context_size(slots: list[BatchedSequence]) -> None:
    assert [slot.n_ctx for slot in slots] == [N_CTX] * SLOTS


@pytest.mark.slow  # three generations of the real model
def test_constrained_generations_at_once_each_within_its_grammar(
    slots: list[BatchedSequence], gemma_path: Path
) -> None:
    with Client("local") as client:
        vocab = client.register_vocab(gguf=gemma_path)

        def constrained(slot: BatchedSequence, prompt: str, seed: int, max_tokens: int) -> Generation:
            with client.session(vocab, gbnf=GRAMMAR) as session:
                return generate(slot, slot.tokenize(prompt), SamplerSettings(seed=seed), session=session,
                                max_tokens=max_tokens)

        # different budgets: sequences end at different steps and the others go on without them
        work = [released(slot, lambda s=slot, p=p, i=i: constrained(s, p, i, 6 + 4 * i))
                for i, (slot, p) in enumerate(zip(slots, PROMPTS, strict=True))]
        got = at_once(work)
    for generation in got:
        assert isinstance(generation, Generation), generation
        if generation.stop_reason == "eog":
            assert re.fullmatch(r"Answer: [0-9]+\.", generation.text)
        else:
            assert re.fullmatch(r"Answer: [0-9]*", generation.text)
    assert [cells(slot) for slot in slots] == [-1] * SLOTS


@pytest.mark.slow
def test_steps_wait_only_for_active_sequences(slots: list[BatchedSequence]) -> None:
    # one generation alone, the other sequences idle (never reset): it does not wait for them
    slot = slots[1]
    generation = released(slot, lambda: generate(slot, slot.tokenize(PROMPTS[1]), max_tokens=5))()
    assert isinstance(generation, Generation)
    assert len(generation.tokens) == 5
    assert cells(slot) == -1


@pytest.mark.slow
def test_a_failed_sequence_fails_alone_and_its_slot_is_reused(slots: list[BatchedSequence]) -> None:
    too_long = list(range(1000, 1000 + N_CTX + 1))
    work = [
        released(slots[0], lambda: generate(slots[0], too_long, max_tokens=4)),
        released(slots[1], lambda: generate(slots[1], slots[1].tokenize(PROMPTS[1]), max_tokens=8)),
    ]
    failed, went_on = at_once(work)
    assert isinstance(failed, ModelError)
    assert isinstance(went_on, Generation) and len(went_on.tokens) == 8
    again = released(slots[0], lambda: generate(slots[0], slots[0].tokenize(PROMPTS[0]), max_tokens=3))()
    assert isinstance(again, Generation) and len(again.tokens) == 3
    assert [cells(slot) for slot in slots] == [-1] * SLOTS


def test_a_batched_sequence_cannot_be_cut_back(slots: list[BatchedSequence]) -> None:
    with pytest.raises(ModelError):
        slots[0].truncate(0)
