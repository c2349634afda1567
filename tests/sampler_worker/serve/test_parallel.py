"""--parallel 2: two generations at once in one batched llama.cpp context, each within its grammar.

Batching changes llama.cpp's float reductions, so a batched generation's tokens need not be a one-slot
server's: what holds is that both run at once, a third request finds no slot (no queue: 429), and each
text is one the grammar takes (constraintd accepted every token).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sampler_worker.serve.conftest import ANSWER_GRAMMAR, QUESTION, LiveServer, live_server

MAX_TOKENS = 12
# ANSWER_GRAMMAR's texts, and their beginnings where the token budget ran out first
WHOLE = re.compile(r"Answer: [0-9]+\.")
CUT = re.compile(r"Answer: [0-9]*")


@pytest.fixture(scope="module")
def two_slots(gemma_path: Path) -> Iterator[LiveServer]:
    with live_server(gemma_path, parallel=2, max_queue=0, timeout=300, n_ctx=1024) as live:
        yield live


def request(seed: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": QUESTION}], "grammar": ANSWER_GRAMMAR, "seed": seed,
            "max_tokens": MAX_TOKENS, "return_tokens": True, "stream": True}


def answer_of(lines: Iterator[str]) -> tuple[str, str | None]:
    """The streamed content and finish reason."""
    content, reason = "", None
    for line in lines:
        if line.startswith("data: {"):
            choice = json.loads(line[6:])["choices"][0]
            content += choice["delta"].get("content") or ""
            reason = choice.get("finish_reason") or reason
    return content, reason


def within_grammar(content: str, reason: str | None) -> bool:
    return bool(WHOLE.fullmatch(content)) if reason == "stop" else bool(CUT.fullmatch(content))


@pytest.mark.slow  # a second server, a second load of the model
def test_two_generations_run_at_once_within_their_grammars_and_a_third_finds_no_slot(
    two_slots: LiveServer,
) -> None:
    with two_slots.http() as client:
        with client.stream("POST", "/v1/chat/completions", json=request(3)) as first, \
                client.stream("POST", "/v1/chat/completions", json=request(4)) as second:
            a, b = first.iter_lines(), second.iter_lines()
            head_a, head_b = next(a), next(b)  # both started: both hold a slot
            third = client.post("/v1/chat/completions", json={**request(5), "stream": False})
            assert third.status_code == 429
            got = [answer_of(iter([head_a, *a])), answer_of(iter([head_b, *b]))]
        two_slots.wait_idle()
        # and again, with the slots (their sequences) reused
        again = [client.post("/v1/chat/completions", json={**request(seed), "stream": False}).json()
                 for seed in (6, 7)]
    assert all(within_grammar(content, reason) for content, reason in got), got
    for body in again:
        choice = body["choices"][0]
        assert within_grammar(choice["message"]["content"], choice["finish_reason"]), body
    generations = two_slots.state.generations
    assert set(generations._free) == set(generations.contexts)
