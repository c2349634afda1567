"""The memory settler (constraintd/server/memory.py): when it gives memory back, and that it does."""

from __future__ import annotations

from constraintd.server.memory import MIN_BLOCKS_FREED, MIN_THRESHOLD, MemorySettler, resident_bytes

MIB = 1 << 20


class Process:
    """Readings a test sets: resident bytes and live blocks; each settling gives back `reclaimable`."""

    def __init__(self) -> None:
        self.resident = 100 * MIB
        self.blocks = 1_000_000
        self.reclaimable = 0
        self.collections = 0
        self.trims = 0

    def collect(self) -> int:
        self.collections += 1
        self.resident -= self.reclaimable
        self.reclaimable = 0
        return 0

    def trim(self) -> None:
        self.trims += 1


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
    assert (process.collections, process.trims) == (1, 1)
    assert memory.level == 110 * MIB  # what is still in use raises the level
    assert memory.tick() is None and process.collections == 1  # and is not collected again


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


def test_a_small_drop_in_objects_is_left_alone() -> None:
    process = Process()
    memory = settler(process)
    process.blocks -= MIN_BLOCKS_FREED - 1
    assert memory.tick() is None and process.collections == 0


def test_cyclic_garbage_is_given_back_to_the_system() -> None:
    # this process's size read as if it were a 50 MiB server's, whose threshold the burst passes
    # (the test runner itself may be hundreds of MiB: a tenth of that is more than the burst)
    offset = resident_bytes() - 50 * MIB
    memory = MemorySettler(resident=lambda: resident_bytes() - offset)
    burst = []
    for _ in range(400_000):  # about 40 MiB of lists that hold themselves: only a collection frees them
        cycle: list[object] = []
        cycle.append(cycle)
        burst.append(cycle)
    grown = resident_bytes() - offset
    assert memory.tick() is None  # still building
    del burst, cycle
    settled = memory.tick()
    assert settled is not None and settled.before >= grown - 4 * MIB
    assert settled.after < grown - 20 * MIB, (grown, settled)
