"""--parallel 2: two generations at once over one loaded model, each as a one-slot server makes it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.sampler_worker.serve.conftest import ANSWER_GRAMMAR, QUESTION, LiveServer, live_server


@pytest.fixture(scope="module")
def two_slots(gemma_path: Path) -> Iterator[LiveServer]:
    with live_server(gemma_path, parallel=2, max_queue=0, timeout=300, n_ctx=1024) as live:
        yield live


def request(seed: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": QUESTION}], "grammar": ANSWER_GRAMMAR, "seed": seed,
            "max_tokens": 12, "return_tokens": True, "stream": True}


def tokens_of(lines: Iterator[str]) -> list[int]:
    return [t for line in lines if line.startswith("data: {") for t in json.loads(line[6:]).get("tokens", [])]


@pytest.mark.slow  # a second server, a second load of the model
def test_two_generations_run_at_once_and_a_third_waits_for_none(
    two_slots: LiveServer, server: LiveServer, http: httpx.Client
) -> None:
    with two_slots.http() as client:
        with client.stream("POST", "/v1/chat/completions", json=request(3)) as first, \
                client.stream("POST", "/v1/chat/completions", json=request(4)) as second:
            a, b = first.iter_lines(), second.iter_lines()
            head_a, head_b = next(a), next(b)  # both started: both hold a slot
            third = client.post("/v1/chat/completions", json={**request(5), "stream": False})
            assert third.status_code == 429
            got = [tokens_of(iter([head_a, *a])), tokens_of(iter([head_b, *b]))]
        two_slots.wait_idle()
    # each is what the one-slot server generates for the same request
    alone = [http.post("/v1/chat/completions", json={**request(seed), "stream": False}).json()["tokens"]
             for seed in (3, 4)]
    assert got == alone
