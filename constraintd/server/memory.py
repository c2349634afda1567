# Memory given back after a burst of work.
#
# What a burst frees, CPython and glibc keep: cyclic garbage waits for the next full collection; the
# objects on the interpreter's free lists (tuples above all) each pin a 1 MiB arena of its small-object
# allocator, however empty the rest of the arena is; and glibc keeps the top of its heap. Measured with a
# JSON session 10,000 arrays deep over qwen2 (86 MiB at the deepest): once it is dropped, 24-46 MiB stay
# resident; a full collection (which also empties the free lists) brings that to 7-9 MiB, and
# malloc_trim(0) to below where the walk began. A server that lived through one attack kept its peak.
#
# The settler reads the process's resident size and its count of live small objects
# (`sys.getallocatedblocks`) every `interval` seconds. It settles once the size has stopped growing since
# the last reading (nothing is in the middle of building) and either the size stands more than its
# threshold above the level the last settling left, or more than BLOCKS_FREED of the objects live at
# their peak since then are gone (a burst's work was let go, but the size did not move: that is what the
# arenas and free lists keep). Settling is malloc_trim first (microseconds; enough when what was freed was
# the C heap's: a large request's bytes, protobuf's arenas), then, when objects were let go or the size is
# still over the threshold, a full collection and malloc_trim again: a full collection walks every object
# in the collector's sight and stops the event loop meanwhile (tens to hundreds of milliseconds with many
# grammars cached). The size after is the new level. A size that fell on its own by more than GROWING
# since the last reading (a session closed: its arenas went back) is trimmed too, without a collection:
# glibc keeps the C heap's share of what was let go until malloc_trim (1-1.5 MiB after a session that
# replayed and accepted a million tokens each, which an idle server otherwise kept).
# Memory still in use is not given back and raises the level: the next settling waits for as much growth
# again, so a server with a large live working set pays one full collection per threshold of growth
# (Python's own collector runs one per quarter of growth).
#
# What no settling gives back is an arena of Python's small-object allocator (1 MiB) that still holds one
# object: an arena goes back to the system only when every block in it is free. A deep walk fills scores
# of arenas with its states, and the few objects that outlive it (a state the grammar keeps, the next
# call's future, a counter's new float) stay scattered among them: measured with the walk above over a
# server process, 9 MiB kept after one walk and 22-24 MiB after four to six, though the live objects did
# not grow. With Python's objects on glibc's malloc (PYTHONMALLOC=malloc, set in the server's
# environment) an object that outlives a burst keeps its page, not its arena, and malloc_trim gives back
# every free page, between live blocks too: the same walks leave 2.7-3.0 MiB, round after round. It is not
# the default, because it costs the masks of new grammars far more than the memory is worth to most
# servers: with bench_masks (qwen2, 30 schemas, no peers) run twice on each allocator, the first-visit
# masks of short documents took 1.49 and 1.76 ms at p50 on malloc against 0.36 and 0.41 ms, while
# llama.cpp's own grammar, timed in the same runs, moved by at most 1.6x. A deep walk also takes about a
# sixth more memory at its deepest (malloc's headers). On malloc `sys.getallocatedblocks` reads 0: the
# settler counts live objects as the bytes malloc has handed out instead (`live_blocks`, in blocks of
# AVERAGE_BLOCK bytes), so a burst let go is still seen.
#
# The collector's own pauses are recorded too (`CollectorPauses`): a full collection walks every object in
# its sight and holds the GIL meanwhile, so it stops the event loop as long as it runs (415 ms of CPU over
# 639k objects after 80 schemas' documents walked over qwen2); the metrics show each generation's pauses.
#
# Invariants:
# - `tick` runs on the event loop (a full collection holds the GIL wherever it runs); it costs a read of
#   /proc when there is nothing to settle.
# - The threshold is the larger of MIN_THRESHOLD and THRESHOLD_FRACTION of the level.
# - `CollectorPauses` observes from a callback of the collector, on whatever thread collects: the one
#   writer of what it feeds, since collections never overlap.
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from constraintd.service.log_events import fields

__all__ = [
    "CollectorPauses", "MemorySettler", "Settling", "fix_mmap_threshold", "live_blocks", "malloc_trim",
    "resident_bytes",
]

log = logging.getLogger("constraintd.server")

MIN_THRESHOLD = 4 << 20
THRESHOLD_FRACTION = 0.10
GROWING = 1 << 20  # a rise since the last reading larger than this means work is still building
BLOCKS_FREED = 0.10  # of the peak count of live objects: a drop this large is a burst let go
MIN_BLOCKS_FREED = 50_000  # and at least this many objects (a few MiB)
_PAGE = os.sysconf("SC_PAGE_SIZE")
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 128 << 10  # glibc's own starting value
AVERAGE_BLOCK = 64  # bytes: about a small object with malloc's header, for `live_blocks`


def resident_bytes(pid: int | None = None) -> int:
    """A process's resident size, this one's by default (Linux's /proc/PID/statm; 0 where there is none)."""
    try:
        with open(f"/proc/{pid or 'self'}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except OSError:
        return 0


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim, libc.mallopt  # noqa: B018  (glibc's; musl has neither)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _glibc()


class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (2.33 and later)
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost",
        )
    ]


def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    function = getattr(_LIBC, "mallinfo2", None)
    if function is None:
        return None
    function.restype = _MallInfo2
    function.argtypes = []
    return cast(Callable[[], _MallInfo2], function)


_MALLINFO2 = _mallinfo2()


def live_blocks() -> int:
    """Python's live small objects (`sys.getallocatedblocks`); on the system allocator, where that reads
    0, the bytes glibc's heaps have handed out (large blocks, on pages of their own, not counted) in blocks
    of AVERAGE_BLOCK bytes; 0 where neither can be read."""
    blocks = sys.getallocatedblocks()
    if blocks or _MALLINFO2 is None:
        return blocks
    return int(_MALLINFO2().uordblks) // AVERAGE_BLOCK


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Allocations of `size` bytes or more get pages of their own, given back when freed (glibc's
    M_MMAP_THRESHOLD, and no more of its dynamic threshold). glibc raises the threshold to the largest
    block freed so far (up to 32 MiB) and the heap's trim threshold to twice that: after one 16 MiB request
    each thread's heap kept its 16 MiB, which malloc_trim does not return from a thread's heap.
    False where the C library is not glibc."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, size))


def malloc_trim() -> None:
    """Gives the C heap's free top back to the system (glibc's malloc_trim(0)); nothing elsewhere."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


@dataclass(frozen=True)
class Settling:
    """One settling: resident bytes before and after, the seconds it held the loop, and whether it ran a
    full collection."""

    before: int
    after: int
    seconds: float
    collected: bool


class MemorySettler:
    """Gives freed memory back once a burst is over (see the comment at the top of the module)."""

    def __init__(
        self,
        *,
        interval: float = 1.0,
        resident: Callable[[], int] = resident_bytes,
        blocks: Callable[[], int] = live_blocks,
        collect: Callable[[], object] = gc.collect,
        trim: Callable[[], None] = malloc_trim,
    ) -> None:
        self.interval = interval
        self._resident = resident
        self._blocks = blocks
        self._collect = collect
        self._trim = trim
        self.level = self._last = resident()
        self._peak_blocks = blocks()
        self.settlings = 0

    def threshold(self) -> int:
        return max(MIN_THRESHOLD, int(self.level * THRESHOLD_FRACTION))

    def tick(self) -> Settling | None:
        """One reading; settles when there is something to give back and nothing is building."""
        now, blocks = self._resident(), self._blocks()
        growing = now - self._last > GROWING
        shrank = self._last - now > GROWING
        self._last = now
        self._peak_blocks = max(self._peak_blocks, blocks)
        freed = self._peak_blocks - blocks
        let_go = freed > MIN_BLOCKS_FREED and freed > self._peak_blocks * BLOCKS_FREED
        started = time.perf_counter()
        if growing or not (let_go or now - self.level > self.threshold()):
            self.level = min(self.level, now)  # what went back on its own
            if not shrank:
                return None
            # something was let go (a session closed, its arenas went back): the C heap keeps its share
            # of it until trimmed, a megabyte or two after a session of a million tokens
            self._trim()
            self.level = self._last = min(self.level, self._resident())
            self.settlings += 1
            return Settling(now, self._last, time.perf_counter() - started, False)
        self._trim()
        collected = let_go or self._resident() - self.level > self.threshold()
        if collected:  # objects let go, or the C heap alone did not give it back
            self._collect()
            self._trim()
        seconds = time.perf_counter() - started
        self.level = self._last = self._resident()
        self._peak_blocks = self._blocks()
        self.settlings += 1
        return Settling(now, self.level, seconds, collected)

    async def run(self) -> None:
        """Ticks every `interval` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            settled = self.tick()
            if settled is not None:
                log.info(
                    "memory settled",
                    extra=fields(
                        before_mib=round(settled.before / (1 << 20), 1),
                        after_mib=round(settled.after / (1 << 20), 1),
                        ms=round(settled.seconds * 1000, 1),
                        collected=settled.collected,
                    ),
                )


class CollectorPauses:
    """Hands each pause of the cyclic collector, in seconds and with its generation, to `observe`, while
    `start`ed."""

    def __init__(
        self, observe: Callable[[float, str], None], clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._observe = observe
        self._clock = clock
        self._began = 0.0

    def start(self) -> None:
        """Records every collection from now on (idempotent)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        # collections never overlap (the collector runs one at a time), so one start time serves
        if phase == "start":
            self._began = self._clock()
        else:
            self._observe(self._clock() - self._began, str(info["generation"]))
