"""Nothing leaks: after 200 requests from four clients at once (good ones, refused grammars and schemas,
clients gone mid-stream or before their answer) no generation runs, constraintd holds no session, every
context is back in the pool, and the process's memory has stopped growing."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.sampler_worker.serve.conftest import LiveServer, live_server
from tests.sampler_worker.serve.traffic import KINDS, drive, expected

REQUESTS = 200
WARM_UP = 2 * len(KINDS)  # every kind twice: compiled grammars, mask tables and worker threads made
CLIENTS = 4
# Resident memory may move by allocator noise, not by what 180 requests would leave behind if each kept
# a logits row (1 MiB over 262,144 tokens), a context or a mask table.
GROWTH_BOUND = 24 << 20  # measured: about 6 MiB over the 180


@pytest.fixture(scope="module")
def queued(gemma_path: Path) -> Iterator[LiveServer]:
    """Two slots and a queue, so four clients at once are all served."""
    with live_server(gemma_path, parallel=2, max_queue=8, timeout=120, n_ctx=512) as live:
        yield live


def resident_bytes() -> int:
    found = re.search(r"^VmRSS:\s+(\d+) kB$", Path("/proc/self/status").read_text(), re.MULTILINE)
    assert found
    return int(found.group(1)) << 10


def gauges(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    names = ("generations_active", "requests_waiting", "constraintd_sessions_open")
    return {name: float(re.search(rf"^sampler_worker_{name} (\S+)$", text, re.MULTILINE)[1])  # type: ignore[index]
            for name in names}


@pytest.mark.slow  # 200 generations of a few tokens
def test_nothing_leaks_after_200_requests(queued: LiveServer) -> None:
    warm = drive(queued.url, count=WARM_UP, clients=CLIENTS)
    queued.wait_idle()
    threads, before = threading.active_count(), resident_bytes()
    rest = drive(queued.url, count=REQUESTS - WARM_UP, clients=CLIENTS, first=WARM_UP)
    queued.wait_idle()
    after = resident_bytes()

    got = warm + rest
    assert got == expected(got)
    assert sum(got.values()) == REQUESTS
    generations = queued.state.generations
    assert queued.open_sessions() == 0
    assert set(generations._free) == set(generations.contexts)
    assert not generations._runs
    with queued.http() as client:
        assert gauges(client) == {"generations_active": 0, "requests_waiting": 0,
                                  "constraintd_sessions_open": 0}
    assert threading.active_count() <= threads
    assert after - before < GROWTH_BOUND, f"resident memory grew {(after - before) >> 20} MiB"
