"""Grammar states counted with the cyclic collector off: what a dropped grammar leaves without it."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator

from constraintd.engine.grammar.stack_sets import State


def live_states() -> int:
    """Grammar states alive in the process now."""
    return sum(type(found) is State for found in gc.get_objects())


@contextlib.contextmanager
def collector_off() -> Iterator[Callable[[], int]]:
    """The cyclic collector stopped for the block, after one collection; gives `live_states`."""
    gc.collect()
    gc.disable()
    try:
        yield live_states
    finally:
        gc.enable()
