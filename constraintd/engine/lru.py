# A bounded cache that drops its least recently used entries: the one LRU of the project.
#
# Contract:
# - Each entry is put with its size (bytes of arrays for masks and verdicts, 1 to count entries); once the
#   sizes add up past `max_size`, or the entries outnumber `max_entries` (when given), the least recently
#   used entries are dropped (the one just put too, when it alone is larger: a bound of 0 keeps nothing).
#   `put` and `remeasure` answer what they dropped, for an owner that keeps something tied to an entry.
# - A size is what the owner said when it put the entry; an owner whose values grow (the registry's
#   compiled grammars learn masks and states) says their sizes again with `remeasure`.
# - `get` makes an entry the most recently used, `peek` does not. A key put again keeps its first value
#   (another thread made the same), so a value once handed out stays the one the cache answers with.
# - No locks: when threads race, the total may drift and an entry may be dropped early, never an answer
#   changed. A caller that needs more (the service registry's bounded maps) holds its own lock around it.
# - The owner of a cache is the object whose lifetime bounds it (a grammar's masks, a vocabulary's
#   verdicts, the registry's compiled grammars): there is no module-level instance.
# - The values and their sizes are two dicts, not one of (value, size) pairs: a pair holding an object
#   stays in the cyclic collector's sight as long as it lives, one per entry (25,000 of them in the stack
#   top caches of 20 grammars over qwen2), and a full collection walks each; a dict of sizes leaves it.
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

__all__ = ["LruCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """Entries dropped least recently used first once their sizes add up past `max_size`."""

    __slots__ = ("_entries", "_sizes", "max_entries", "max_size", "size")

    def __init__(self, max_size: int, *, max_entries: int | None = None) -> None:
        self.max_size = max_size
        self.max_entries = max_entries
        self.size = 0
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._sizes: dict[K, int] = {}

    def get(self, key: K) -> V | None:
        """The entry, now the most recently used; None if absent."""
        entries = self._entries
        found = entries.get(key)
        if found is None:
            return None
        # not contextlib.suppress: a context manager costs more than the lookup it guards
        try:  # noqa: SIM105
            entries.move_to_end(key)
        except KeyError:  # dropped meanwhile by another thread
            pass
        return found

    def peek(self, key: K) -> V | None:
        """The entry, its order unchanged; None if absent."""
        return self._entries.get(key)

    def put(self, key: K, value: V, size: int = 1) -> Sequence[tuple[K, V]]:
        """Keeps `value` (a key already there keeps its first value) and drops what exceeds the bounds.

        Returns:
            The entries dropped, least recently used first (empty almost always).
        """
        entries = self._entries
        if key in entries:
            return ()
        self._sizes[key] = size
        entries[key] = value
        self.size += size
        if self.size > self.max_size or (self.max_entries is not None and len(entries) > self.max_entries):
            return self._shrink()
        return ()

    def pop(self, key: K) -> V | None:
        """Drops the entry and answers it; None if absent."""
        found = self._entries.pop(key, None)
        if found is None:
            return None
        self.size -= self._sizes.pop(key, 0)
        return found

    def remeasure(self, size_of: Callable[[V], int]) -> Sequence[tuple[K, V]]:
        """Sizes every entry again with `size_of` (a walk of all entries) and drops what now exceeds the
        bounds, least recently used first; answers the entries dropped."""
        sizes = self._sizes
        for key, value in list(self._entries.items()):
            sizes[key] = size_of(value)
        self.size = sum(sizes.values())
        return self._shrink()

    def drop_oldest(self) -> list[tuple[K, V]]:
        """Drops the least recently used entry; answers it (empty when there was none)."""
        try:
            key, value = self._entries.popitem(last=False)
        except KeyError:
            return []
        self.size -= self._sizes.pop(key, 0)
        return [(key, value)]

    def items(self) -> list[tuple[K, V]]:
        """The entries, least recently used first (a copy; the order is unchanged)."""
        return list(self._entries.items())

    def _shrink(self) -> list[tuple[K, V]]:
        entries, sizes = self._entries, self._sizes
        limit = len(entries) if self.max_entries is None else self.max_entries
        dropped: list[tuple[K, V]] = []
        while (self.size > self.max_size or len(entries) > limit) and entries:
            try:
                key, value = entries.popitem(last=False)
            except KeyError:
                break
            self.size -= sizes.pop(key, 0)
            dropped.append((key, value))
        return dropped

    def clear(self) -> None:
        """Drops every entry."""
        self._entries.clear()
        self._sizes.clear()
        self.size = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        return key in self._entries
