"""A llama.cpp context of n sequences stepped together: every generation goes on within its grammar, a
lone generation does not wait for idle slots, a failure or a cancellation reaches only its own lane (the
prompt's evaluation included), and a lane's cells are gone once it has ended."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clients import Client
from sampler_worker.chain import SamplerSettings
from sampler_worker.generate import Generation, Step
from sampler_worker.model import Model, ModelError
from sampler_worker.serve.contexts import BatchedContext, Row, Slot, contexts
from sampler_worker.serve.lockstep import Lockstep

SLOTS = 3
N_CTX = 256
N_BATCH = 64  # a longer prompt is evaluated over several steps
GRAMMAR = 'root ::= "Answer: " [0-9]+ "."'
PROMPTS = ("What is 6 times 7? Answer:", "The capital of France is", "1, 2, 3, 4,")


class Stopped(Exception):
    pass


@pytest.fixture(scope="module")
def model(gemma_path: Path) -> Iterator[Model]:
    with Model(gemma_path, n_ctx=N_CTX, n_threads=2, n_batch=N_BATCH) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def client(gemma_path: Path) -> Iterator[Client]:
    with Client("local") as local:
        yield local


@pytest.fixture(scope="module")
def slots(model: Model) -> Iterator[list[Slot]]:
    made = contexts(model, SLOTS, threads=1)  # one thread: one context of every slot
    assert all(isinstance(slot, Slot) for slot in made)
    assert len({id(slot.batched) for slot in made}) == 1  # type: ignore[union-attr]
    yield made  # type: ignore[misc]
    made[0].batched.close()  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def lockstep(slots: list[Slot], client: Client) -> Iterator[Lockstep]:
    stepper = Lockstep(slots[0].batched, client=client)
    yield stepper
    stepper.close()


def cells(slot: Slot) -> int:
    """The highest position the sequence holds in the KV cache (-1: none)."""
    batched = slot.batched
    return int(batched._ll.llama_memory_seq_pos_max(batched._memory, slot.seq))


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


def test_one_slot_is_the_model_itself(model: Model) -> None:
    assert contexts(model, 1, threads=2) == [model]


@pytest.mark.slow
def test_slots_are_sequences_of_one_context_over_every_thread(model: Model) -> None:
    made = contexts(model, 3, threads=2)
    try:
        assert all(isinstance(slot, Slot) for slot in made)
        slots: list[Slot] = made  # type: ignore[assignment]
        batched = slots[0].batched
        assert [slot.batched for slot in slots] == [batched] * 3
        assert [slot.seq for slot in slots] == [0, 1, 2]
        assert batched.n == 3
    finally:
        slots[0].batched.close()  # type: ignore[union-attr]


def test_a_layout_of_no_context_is_refused(model: Model) -> None:
    with pytest.raises(ValueError, match="--contexts must be at least 1, not 0"):
        contexts(model, 2, threads=2, groups=0)


@pytest.mark.slow
def test_slots_spread_over_the_contexts_asked_for(model: Model) -> None:
    made = contexts(model, 5, threads=2, groups=2)
    try:
        assert all(isinstance(slot, Slot) for slot in made)
        slots: list[Slot] = made  # type: ignore[assignment]
        first, second = slots[0].batched, slots[1].batched
        assert first is not second
        assert [slot.batched for slot in slots] == [first, second, first, second, first]
        assert [slot.seq for slot in slots] == [0, 0, 1, 1, 2]
        assert (first.n, second.n) == (3, 2)
    finally:
        for slot in made:
            slot.batched.close()  # type: ignore[union-attr]


class CountedContext(BatchedContext):
    """The context `contexts` makes, counting the graph nodes llama.cpp computes (its eval callback)."""

    nodes = 0

    def _params(self, model: Model, n: int, threads: int) -> Any:
        params = super()._params(model, n, threads)
        ll = model._ll

        def asked(tensor: Any, ask: bool, data: Any) -> bool:
            self.nodes += ask
            return False  # not looked at: the scheduler computes on to the graph's end

        self._asked = ll.ggml_backend_sched_eval_callback(asked)  # kept alive with the context
        params.cb_eval = self._asked
        return params

    def nodes_of(self, rows: list[Row]) -> int:
        before = self.nodes
        self.decode(rows)
        return self.nodes - before


@pytest.mark.slow
def test_a_step_is_one_graph_whatever_its_rows(model: Model) -> None:
    # one graph's nodes for the rows of a step in any order, with gaps between their sequences and a
    # prompt among them: llama.cpp computes them as one micro-batch. With a cache per sequence it splits
    # these rows into three (sequences 3 and 4, then 0 and 1, then the rest of 1's prompt).
    batched = CountedContext(model, 5, threads=1)
    try:
        alone = batched.nodes_of([Row(2, 0, [818, 5279], logits=True)])
        assert alone > 0
        together = batched.nodes_of([
            Row(3, 0, [818], logits=True), Row(0, 0, [5279], logits=True), Row(4, 0, [236743], logits=True),
            Row(1, 0, [818, 5279, 563], logits=True),
        ])
        assert together == alone
    finally:
        batched.close()


@pytest.mark.slow
def test_each_sequence_has_the_model_context_size(slots: list[Slot]) -> None:
    assert [slot.n_ctx for slot in slots] == [N_CTX] * SLOTS


@pytest.mark.slow  # three generations of the real model
def test_constrained_generations_at_once_each_within_its_grammar(
    slots: list[Slot], lockstep: Lockstep, client: Client, gemma_path: Path
) -> None:
    vocab = client.register_vocab(gguf=gemma_path)

    def constrained(slot: Slot, prompt: str, seed: int, max_tokens: int) -> Generation:
        with client.session(vocab, gbnf=GRAMMAR) as session:
            return lockstep.generate(slot, slot.tokenize(prompt), SamplerSettings(seed=seed), session=session,
                                     max_tokens=max_tokens)

    # different budgets: lanes end at different steps and the others go on without them
    got = at_once([lambda s=slot, p=p, i=i: constrained(s, p, i, 6 + 4 * i)
                   for i, (slot, p) in enumerate(zip(slots, PROMPTS, strict=True))])
    for generation in got:
        assert isinstance(generation, Generation), generation
        if generation.stop_reason == "eog":
            assert re.fullmatch(r"Answer: [0-9]+\.", generation.text)
        else:
            assert re.fullmatch(r"Answer: [0-9]*", generation.text)
    assert sum(g.counters.rejections for g in got if isinstance(g, Generation)) > 0  # masks were used
    assert [cells(slot) for slot in slots] == [-1] * SLOTS


@pytest.mark.slow
def test_a_lone_generation_does_not_wait_for_idle_slots(slots: list[Slot], lockstep: Lockstep) -> None:
    slot = slots[1]
    generation = lockstep.generate(slot, slot.tokenize(PROMPTS[1]), max_tokens=5)
    assert len(generation.tokens) == 5
    assert cells(slot) == -1


@pytest.mark.slow
def test_a_failed_lane_fails_alone_and_its_slot_is_reused(slots: list[Slot], lockstep: Lockstep) -> None:
    def refuse(step: Step) -> None:
        if step.index == 2:
            raise Stopped("the client went away")

    work: list[Callable[[], object]] = [
        lambda: lockstep.generate(slots[0], slots[0].tokenize(PROMPTS[0]), max_tokens=8, on_step=refuse),
        lambda: lockstep.generate(slots[1], slots[1].tokenize(PROMPTS[1]), max_tokens=8),
    ]
    failed, went_on = at_once(work)
    assert isinstance(failed, Stopped)
    assert isinstance(went_on, Generation) and len(went_on.tokens) == 8
    again = lockstep.generate(slots[0], slots[0].tokenize(PROMPTS[0]), max_tokens=3)
    assert len(again.tokens) == 3
    assert [cells(slot) for slot in slots] == [-1] * SLOTS


@pytest.mark.slow
def test_a_lane_cancelled_during_its_prompt_ends_before_any_token(
    slots: list[Slot], lockstep: Lockstep
) -> None:
    # a prompt longer than a batch is evaluated over several steps; `check` runs before each of them
    checks = 0

    def check() -> None:
        nonlocal checks
        checks += 1
        if checks == 2:
            raise Stopped("cancelled")

    steps: list[Step] = []
    long_prompt = slots[2].tokenize(" ".join(["word"] * 200))
    assert len(long_prompt) > 3 * N_BATCH
    with pytest.raises(Stopped):
        lockstep.generate(slots[2], long_prompt, max_tokens=4, on_step=steps.append, check=check)
    assert checks == 2 and steps == []
    assert cells(slots[2]) == -1


def test_settings_are_refused_on_the_callers_thread(slots: list[Slot], lockstep: Lockstep) -> None:
    with pytest.raises(ValueError, match="penalty_repeat"):
        lockstep.generate(slots[0], [2, 3], SamplerSettings(repeat_penalty=0.0))


@pytest.mark.slow
def test_a_prompt_longer_than_the_sequence_is_refused(slots: list[Slot], lockstep: Lockstep) -> None:
    with pytest.raises(ModelError, match="full"):
        lockstep.generate(slots[0], list(range(1000, 1000 + N_CTX + 1)), max_tokens=4)


@pytest.fixture(scope="module")
def ahead(slots: list[Slot], client: Client) -> Iterator[Lockstep]:
    """A second stepper of the same context, mask-ahead (the tests use one stepper at a time)."""
    stepper = Lockstep(slots[0].batched, client=client, overlap="ahead")
    yield stepper
    stepper.close()


def test_an_unknown_overlap_is_refused(slots: list[Slot], client: Client) -> None:
    with pytest.raises(ValueError, match="off or ahead"):
        Lockstep(slots[0].batched, client=client, overlap="auto")  # type: ignore[arg-type]


@pytest.mark.slow
def test_mask_ahead_draws_the_tokens_of_reject_then_mask(
    slots: list[Slot], lockstep: Lockstep, ahead: Lockstep, client: Client, gemma_path: Path
) -> None:
    # one lane alone: every step's batch has the same shape in both modes, so the same logits
    vocab = client.register_vocab(gguf=gemma_path)
    slot = slots[0]
    rejections = 0
    for seed in (1, 2, 3):
        got = []
        for stepper in (lockstep, ahead):
            with client.session(vocab, gbnf=GRAMMAR) as session:
                prompt = slot.tokenize(PROMPTS[seed - 1])
                got.append(stepper.generate(slot, prompt, SamplerSettings(seed=seed), session=session,
                                            max_tokens=10))
        off, early = got
        assert (early.tokens, early.rejected_at, early.text) == (off.tokens, off.rejected_at, off.text)
        assert (off.overlap, early.overlap) == ("off", "ahead")
        assert early.counters.ahead_steps == len(early.tokens)
        assert early.counters.draws == off.counters.draws
        rejections += len(early.rejected_at)
    assert rejections > 0  # a mask was used to redraw
    assert cells(slot) == -1


@pytest.mark.slow
def test_mask_ahead_generations_at_once_each_within_its_grammar(
    slots: list[Slot], ahead: Lockstep, client: Client, gemma_path: Path
) -> None:
    vocab = client.register_vocab(gguf=gemma_path)

    def constrained(slot: Slot, prompt: str, seed: int, max_tokens: int) -> Generation:
        with client.session(vocab, gbnf=GRAMMAR) as session:
            return ahead.generate(slot, slot.tokenize(prompt), SamplerSettings(seed=seed), session=session,
                                  max_tokens=max_tokens)

    work: list[Callable[[], object]] = [
        lambda s=slot, p=p, i=i: constrained(s, p, i, 6 + 4 * i)
        for i, (slot, p) in enumerate(zip(slots, PROMPTS, strict=True))
    ]
    work[1] = lambda: ahead.generate(slots[1], slots[1].tokenize(PROMPTS[1]), max_tokens=5)  # unconstrained
    got = at_once(work)
    for i, generation in enumerate(got):
        assert isinstance(generation, Generation), generation
        if i == 1:
            assert len(generation.tokens) == 5 and generation.overlap == "off"
            continue
        assert generation.overlap == "ahead"
        pattern = r"Answer: [0-9]+\." if generation.stop_reason == "eog" else r"Answer: [0-9]*"
        assert re.fullmatch(pattern, generation.text)
    assert [cells(slot) for slot in slots] == [-1] * SLOTS


def test_a_reasoning_budget_forces_the_end_and_hands_it_to_the_lazy_grammar(
    slots: list[Slot], lockstep: Lockstep, ahead: Lockstep, client: Client, gemma_path: Path
) -> None:
    # the block is open from the first token (as a prompt ending in <think>), its budget is 3 tokens, then
    # the end tag is forced. The lazy grammar triggers on any character: it must see none of the block, and
    # then, as the budget's end sequence, the end tag; it holds the answer to " Answer: yes." whatever the
    # model would write
    from sampler_worker.reasoning_budget import ReasoningBudget, utf8_complete

    vocab = client.register_vocab(gguf=gemma_path)
    slot = slots[0]
    think, end = (slot.tokenize(tag, add_special=False) for tag in ("<think>", "</think>"))

    def budget() -> ReasoningBudget:
        made = ReasoningBudget([think], [end], end, 3,
                               complete=lambda token: utf8_complete(slot.piece(token, special=False)))
        for token in think:
            made.accept(token)
        return made

    got = []
    for stepper in (lockstep, ahead):
        with client.session(vocab, gbnf='root ::= "</think>" " Answer: yes."',
                            trigger_patterns=[r"[\s\S]"]) as session:
            got.append(stepper.generate(slot, slot.tokenize(PROMPTS[0]), SamplerSettings(seed=4),
                                        session=session, max_tokens=24, budget=budget(), grammar_lazy=True))
    off, early = got
    assert (early.tokens, early.rejected_at, early.text) == (off.tokens, off.rejected_at, off.text)
    assert off.tokens[3 : 3 + len(end)] == tuple(end)  # forced after three tokens
    assert off.text.endswith("</think> Answer: yes.") and off.stop_reason == "eog"
    assert off.rejected_at and min(off.rejected_at) >= 3 + len(end)  # the grammar held only the answer
    assert cells(slot) == -1


class ScriptedBatch:
    """A batched context whose logits after a sequence's tokens depend on the sequence and the position alone,
    so any batching gives every lane the same logits: a stand-in for many lanes at once without a model."""

    n_batch = 64
    n_ctx_seq = 64

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab

    def decode(self, rows: list[Row]) -> list[Any]:
        return [self._logits(row.seq, row.start + len(row.tokens)) if row.logits else None for row in rows]

    def _logits(self, seq: int, position: int) -> Any:
        return np.random.default_rng(1000 * seq + position).normal(0.0, 3.0, self.n_vocab).astype(np.float32)

    def clear(self, seq: int) -> None:
        pass


class ScriptedSlot:
    """A sequence of a `ScriptedBatch`, with the model's few methods a lane needs."""

    # token 0 ends a generation; then letters and digits, of which the grammar below takes digits only
    PIECES = [b"</s>"] + [bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyz0123456789"]
    suppress_tokens: tuple[int, ...] = ()

    def __init__(self, batched: ScriptedBatch, seq: int) -> None:
        self.batched = batched
        self.seq = seq
        self.n_ctx = batched.n_ctx_seq
        self.model = self

    def is_eog(self, token: int) -> bool:
        return token == 0

    def piece(self, token: int, *, special: bool = True) -> bytes:
        return self.PIECES[token]


def test_mask_ahead_lanes_refused_at_one_step_draw_the_tokens_of_reject_then_mask() -> None:
    # four lanes at once, most of whose first draws the grammar refuses at the same steps (a digit is 10
    # tokens of 37): ahead, each refused lane redraws under its own mask once every lane has drawn; its
    # tokens are those of reject-then-mask, lane by lane
    pieces = ScriptedSlot.PIECES
    batched = ScriptedBatch(len(pieces))
    with Client("local") as local:
        vocab = local.register_vocab(pieces=pieces, eog=[0])
        got: dict[str, list[object]] = {}
        for overlap in ("off", "ahead"):
            stepper = Lockstep(batched, client=local, overlap=overlap)  # type: ignore[arg-type]
            try:

                def lane(seq: int, stepper: Lockstep = stepper) -> Generation:
                    slot: Any = ScriptedSlot(batched, seq)
                    with local.session(vocab, gbnf="root ::= [0-9]{12}") as session:
                        return stepper.generate(slot, [1, 2, 3], SamplerSettings(seed=seq), session=session,
                                                max_tokens=12)

                got[overlap] = at_once([partial(lane, seq) for seq in range(4)])
            finally:
                stepper.close()
    for off, early in zip(got["off"], got["ahead"], strict=True):
        assert isinstance(off, Generation) and isinstance(early, Generation), (off, early)
        assert (early.tokens, early.rejected_at) == (off.tokens, off.rejected_at)
        assert re.fullmatch(r"[0-9]{12}", early.text) and early.overlap == "ahead"
        assert len(early.rejected_at) >= 4  # lanes redrew, several at the same steps
