"""The memory settler (constraintd/server/memory.py): when it gives memory back, and that it does."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref

from constraintd.server.memory import MIN_BLOCKS_FREED, MIN_THRESHOLD, CollectorPauses, MemorySettler
from constraintd.server.metrics import Metrics
from tests.server.running import ROOT

MIB = 1 << 20


class Process:
    """Readings a test sets: resident bytes and live blocks; each settling gives back `reclaimable`."""

    def __init__(self) -> None:
        self.resident = 100 * MIB
        self.blocks = 1_000_000
        self.reclaimable = 0  # given back by a full collection
        self.heap_free = 0  # given back by malloc_trim alone
        self.collections = 0
        self.trims = 0

    def collect(self) -> int:
        self.collections += 1
        self.resident -= self.reclaimable
        self.reclaimable = 0
        return 0

    def trim(self) -> None:
        self.trims += 1
        self.resident -= self.heap_free
        self.heap_free = 0


def settler(process: Process) -> MemorySettler:
    return MemorySettler(
        resident=lambda: process.resident,
        blocks=lambda: process.blocks,
        collect=process.collect,
        trim=process.trim,
    )


def test_growth_over_the_threshold_is_settled_once_it_stops() -> None:
    process = Process()
    memory = settler(process)
    process.resident += 30 * MIB  # still building: nothing is done in the middle of it
    assert memory.tick() is None
    process.reclaimable = 20 * MIB
    settled = memory.tick()  # stopped growing, 30 MiB over the level: settled
    assert settled is not None and settled.before == 130 * MIB and settled.after == 110 * MIB
    assert (process.collections, process.trims) == (1, 2)  # the trim alone gave back nothing
    assert settled.collected
    assert memory.level == 110 * MIB  # what is still in use raises the level
    assert memory.tick() is None and process.collections == 1  # and is not collected again


def test_growth_the_c_heap_gives_back_is_settled_without_a_collection() -> None:
    # a large request's bytes freed: malloc_trim returns them, and the collector (a pause of the event loop
    # as long as it walks every object) is not run
    process = Process()
    memory = settler(process)
    process.resident += 30 * MIB
    assert memory.tick() is None
    process.heap_free = 28 * MIB
    settled = memory.tick()
    assert settled is not None and settled.after == 102 * MIB and not settled.collected
    assert (process.collections, process.trims) == (0, 1)


def test_growth_under_the_threshold_is_left_alone() -> None:
    process = Process()
    memory = settler(process)
    process.resident += max(MIN_THRESHOLD, 10 * MIB) - MIB
    assert memory.tick() is None and memory.tick() is None
    assert process.collections == 0


def test_objects_let_go_without_the_size_moving_are_settled() -> None:
    # a closed session's objects are freed, but the arenas and free lists that held them stay resident
    process = Process()
    memory = settler(process)
    process.blocks += 2 * MIN_BLOCKS_FREED * 10
    process.resident += 60 * MIB
    memory.tick()  # building
    assert memory.tick() is not None  # settled at its peak: all of it in use, the level rises
    process.blocks -= 2 * MIN_BLOCKS_FREED * 10
    process.reclaimable = 50 * MIB
    settled = memory.tick()
    assert settled is not None and settled.after == 110 * MIB and process.collections == 2


def test_a_size_that_fell_on_its_own_is_trimmed_without_a_collection() -> None:
    # a closed session: its arenas went back at once, the C heap's share of it waits for malloc_trim
    process = Process()
    memory = settler(process)
    process.resident -= 6 * MIB
    process.heap_free = 2 * MIB
    settled = memory.tick()
    assert settled is not None and settled.after == 92 * MIB and not settled.collected
    assert (process.collections, process.trims, memory.level) == (0, 1, 92 * MIB)
    assert memory.tick() is None and process.trims == 1  # and once only


def test_a_size_that_fell_by_less_than_a_step_is_left_alone() -> None:
    process = Process()
    memory = settler(process)
    process.resident -= MIB // 2
    process.heap_free = 2 * MIB
    assert memory.tick() is None and process.trims == 0


def test_a_small_drop_in_objects_is_left_alone() -> None:
    process = Process()
    memory = settler(process)
    process.blocks -= MIN_BLOCKS_FREED - 1
    assert memory.tick() is None and process.collections == 0


class Node:
    """An object that holds itself: only a collection frees it."""

    def __init__(self) -> None:
        self.me = self


def test_a_settling_runs_the_collector_for_real() -> None:
    # the readings are a test's (a long test run reuses freed memory, so its own size may not move), the
    # collection and the trim are the process's own
    process = Process()
    memory = MemorySettler(resident=lambda: process.resident, blocks=lambda: process.blocks)
    gc.disable()  # no collection but the settler's
    try:
        node = Node()
        freed = weakref.ref(node)
        del node
        process.resident += 30 * MIB
        assert memory.tick() is None and freed() is not None  # still building
        assert memory.tick() is not None
        assert freed() is None  # the settling collected it
    finally:
        gc.enable()


def test_the_collectors_pauses_are_observed_by_generation_until_stopped() -> None:
    metrics = Metrics(sessions_open=lambda: 0, vocabs=lambda: 0, grammars=lambda: 0, cache_bytes=lambda: 0)
    ticks = iter(range(0, 1000, 2))  # each reading of the clock 2 s after the one before
    pauses = CollectorPauses(metrics.collector_seconds.observe, clock=lambda: float(next(ticks)))
    automatic = gc.isenabled()
    gc.disable()  # no collection but the test's own
    pauses.start()
    pauses.start()  # once only
    try:
        gc.collect(0)
        gc.collect()
    finally:
        pauses.stop()
        if automatic:
            gc.enable()
    gc.collect()  # not seen
    lines = metrics.render().splitlines()
    assert 'constraintd_gc_pause_seconds_count{generation="0"} 1' in lines
    assert 'constraintd_gc_pause_seconds_count{generation="2"} 1' in lines
    assert 'constraintd_gc_pause_seconds_sum{generation="2"} 2' in lines  # its start and stop: one step apart
    assert 'constraintd_gc_pause_seconds_bucket{generation="2",le="1"} 0' in lines


def test_live_blocks_are_counted_on_the_system_allocator_too() -> None:
    # sys.getallocatedblocks reads 0 there; the settler would no longer see a burst let go
    script = (
        "import sys; from constraintd.server.memory import live_blocks\n"
        "before = live_blocks(); kept = [[] for _ in range(100_000)]\n"
        "print(sys.getallocatedblocks(), live_blocks() - before)"
    )
    env = dict(os.environ, PYTHONMALLOC="malloc", PYTHONPATH=str(ROOT))
    answer = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, check=True, text=True
    )
    allocated, grown = map(int, answer.stdout.split())
    assert allocated == 0 and grown > 50_000  # 100,000 lists of 56 bytes and their headers
