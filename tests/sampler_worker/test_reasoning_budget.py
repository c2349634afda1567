"""The reasoning budget (sampler_worker/reasoning_budget.py) against llama.cpp's sampler.

The oracle test runs llama.cpp's `common_reasoning_budget` (the chat oracle's "budget" mode, linked against
the pinned sources' llama-common) and the port over the same token streams, and compares after every token:
the state, what `apply` forces, and the end sequence it reports. The streams are drawn (seeded) from an
alphabet that reaches every transition: the tokens of overlapping start and end sequences, the forced
sequence, the Gemma vocabulary's byte tokens that leave a UTF-8 character open (the budget then waits for
it), a special token whose text is empty; budgets of 0 to 5, and each initial state.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sampler_worker.reasoning_budget import BudgetState, ReasoningBudget, utf8_complete
from tests.conftest import OracleReport
from tests.oracle import LlamaVocab

# Gemma's byte tokens: <0xNN> is 238 + NN
_BYTE = 238
LEAD_3 = _BYTE + 0xE2  # opens a three-byte character
CONTINUATION = _BYTE + 0x82
SPECIAL = 105  # <start_of_turn>: no text without special tokens
WORDS = (1000, 1001, 1002)


def test_utf8_complete_reads_the_last_character() -> None:
    assert utf8_complete(b"") and utf8_complete(b"abc") and utf8_complete("é".encode())
    assert utf8_complete("€".encode()) and utf8_complete("a🙂".encode())
    assert not utf8_complete(b"\xe2") and not utf8_complete(b"\xe2\x82") and not utf8_complete(b"\x82")
    assert not utf8_complete(b"\xf0\x9f\x99") and not utf8_complete(b"\x82\x82\x82\x82")


def _budget(budget: int, *, complete: set[int] | None = None,
            initial: BudgetState = BudgetState.IDLE) -> ReasoningBudget:
    # start <think> = 1 2, end </think> = 3 4 or 4 alone, forced = 9 3 4
    return ReasoningBudget([[1, 2]], [[3, 4], [4]], [9, 3, 4], budget, initial=initial,
                           complete=None if complete is None else complete.__contains__)


def _feed(budget: ReasoningBudget, tokens: list[int]) -> list[tuple[BudgetState, int | None]]:
    seen = []
    for token in tokens:
        budget.accept(token)
        seen.append((budget.state, budget.forced_token()))
    return seen


def test_a_block_ends_at_its_end_tag_and_reports_it() -> None:
    budget = _budget(10)
    _feed(budget, [7, 1, 2, 7, 7, 3, 4])
    assert budget.state == BudgetState.DONE and budget.end_match() == (3, 4)
    _feed(budget, [1, 2])  # a new block: a fresh budget, the old end forgotten
    assert budget.state == BudgetState.COUNTING and budget.remaining == 10 and budget.end_match() is None


def test_a_spent_budget_forces_its_sequence_after_the_open_character() -> None:
    budget = _budget(2, complete={1, 2, 7, 9, 3, 4})
    seen = _feed(budget, [1, 2, 7, 8, 8])  # 8: a token that leaves a character open
    assert seen[2:] == [(BudgetState.COUNTING, None), (BudgetState.WAITING_UTF8, None),
                        (BudgetState.WAITING_UTF8, None)]
    seen = _feed(budget, [7, 9, 3, 4])
    assert seen == [(BudgetState.FORCING, 9), (BudgetState.FORCING, 3), (BudgetState.FORCING, 4),
                    (BudgetState.DONE, None)]
    assert budget.end_match() == (3, 4)


def test_a_budget_of_nothing_forces_at_the_start_tag() -> None:
    budget = _budget(0)
    assert _feed(budget, [1, 2]) == [(BudgetState.IDLE, None), (BudgetState.FORCING, 9)]
    assert _budget(0, initial=BudgetState.COUNTING).state == BudgetState.FORCING
    counting = _budget(5, initial=BudgetState.COUNTING)
    assert counting.force() and counting.forced_token() == 9 and not counting.force()


@pytest.mark.oracle
def test_the_budget_is_llama_cpps_on_drawn_streams(gemma_path: Path, oracle_report: OracleReport) -> None:
    from tests.chat_oracle.build import harness_binary, run_harness

    # overlapping sequences, ones that begin others, one that begins with an open character, a duplicate
    starts = [[WORDS[0], WORDS[1]], [WORDS[1]], [WORDS[0]]]
    ends = [[WORDS[2], LEAD_3], [LEAD_3], [WORDS[2], LEAD_3], [WORDS[2]], [LEAD_3, WORDS[2]]]
    forced = [WORDS[0], WORDS[2], LEAD_3]
    alphabet = [*WORDS, LEAD_3, CONTINUATION, SPECIAL, 7]
    rng = random.Random(20261203)
    runs = []
    for _ in range(400):
        chosen_starts = rng.sample(starts, rng.randint(1, 3))
        chosen_ends = rng.sample(ends, rng.randint(1, 5))
        runs.append({
            "start": chosen_starts, "end": chosen_ends,
            "forced": rng.choice([forced, [], forced[:1], forced[1:]]),
            "budget": rng.randint(0, 5), "initial": rng.choice(list(BudgetState)).value,
            "tokens": [rng.choice(alphabet) for _ in range(rng.randint(1, 40))],
        })
    answer = run_harness(harness_binary(), {"mode": "budget", "model": str(gemma_path),
                                            "candidates": sorted(set(alphabet)), "runs": runs})
    assert "error" not in answer, answer
    steps = identical = 0
    with LlamaVocab(gemma_path) as vocab:
        def complete(token: int) -> bool:
            return utf8_complete(vocab.piece(token, special=False))

        for run, expected in zip(runs, answer["runs"], strict=True):
            budget = ReasoningBudget(run["start"], run["end"], run["forced"], run["budget"],
                                     complete=complete, initial=BudgetState(run["initial"]))
            ours = []
            for token in [*run["tokens"], None]:
                forced_token = budget.forced_token()
                end = budget.end_match()
                ours.append({"state": int(budget.state),
                             "kept": None if forced_token is None else [forced_token],
                             "end_match": None if end is None else list(end)})
                if token is not None:
                    budget.accept(token)
            steps += len(ours)
            identical += sum(a == b for a, b in zip(ours, expected, strict=True))
            assert ours == expected, run
    oracle_report.add("reasoning-budget steps", "gemma-3-270m", identical=identical, total=steps)
    # the streams reached every state, and forcing a token, waiting on an open character, a natural end
    states = {step["state"] for run in answer["runs"] for step in run}
    assert states == {state.value for state in BudgetState}
