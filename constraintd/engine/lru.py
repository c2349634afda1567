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
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

__all__ = ["LruCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """Entries dropped least recently used first once their sizes add up past `max_size`."""

    __slots__ = ("_entries", "max_entries", "max_size", "size")

    def __init__(self, max_size: int, *, max_entries: int | None = None) -> None:
        self.max_size = max_size
        self.max_entries = max_entries
        self.size = 0
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()

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
        return found[0]

    def peek(self, key: K) -> V | None:
        """The entry, its order unchanged; None if absent."""
        found = self._entries.get(key)
        return None if found is None else found[0]

    def put(self, key: K, value: V, size: int = 1) -> Sequence[tuple[K, V]]:
        """Keeps `value` (a key already there keeps its first value) and drops what exceeds the bounds.

        Returns:
            The entries dropped, least recently used first (empty almost always).
        """
        entries = self._entries
        if key in entries:
            return ()
        entries[key] = (value, size)
        self.size += size
        if self.size > self.max_size or (self.max_entries is not None and len(entries) > self.max_entries):
            return self._shrink()
        return ()

    def pop(self, key: K) -> V | None:
        """Drops the entry and answers it; None if absent."""
        found = self._entries.pop(key, None)
        if found is None:
            return None
        self.size -= found[1]
        return found[0]

    def remeasure(self, size_of: Callable[[V], int]) -> Sequence[tuple[K, V]]:
        """Sizes every entry again with `size_of` (a walk of all entries) and drops what now exceeds the
        bounds, least recently used first; answers the entries dropped."""
        entries = self._entries
        for key, (value, _) in list(entries.items()):
            entries[key] = (value, size_of(value))
        self.size = sum(size for _, size in entries.values())
        return self._shrink()

    def drop_oldest(self) -> list[tuple[K, V]]:
        """Drops the least recently used entry; answers it (empty when there was none)."""
        try:
            key, (value, size) = self._entries.popitem(last=False)
        except KeyError:
            return []
        self.size -= size
        return [(key, value)]

    def items(self) -> list[tuple[K, V]]:
        """The entries, least recently used first (a copy; the order is unchanged)."""
        return [(key, value) for key, (value, _) in self._entries.items()]

    def _shrink(self) -> list[tuple[K, V]]:
        entries = self._entries
        limit = len(entries) if self.max_entries is None else self.max_entries
        dropped: list[tuple[K, V]] = []
        while (self.size > self.max_size or len(entries) > limit) and entries:
            try:
                key, (value, size) = entries.popitem(last=False)
            except KeyError:
                break
            self.size -= size
            dropped.append((key, value))
        return dropped

    def clear(self) -> None:
        """Drops every entry."""
        self._entries.clear()
        self.size = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        return key in self._entries
