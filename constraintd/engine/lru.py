# A bounded cache that drops its least recently used entries: the one LRU of the project.
#
# Contract:
# - Each entry is put with its size (bytes of arrays for masks and verdicts, 1 to count entries); once the
#   sizes add up past `max_size`, the least recently used entries are dropped (the one just put too, when
#   it alone is larger: a bound of 0 keeps nothing).
# - `get` makes an entry the most recently used, `peek` does not. A key put again keeps its first value
#   (another thread made the same), so a value once handed out stays the one the cache answers with.
# - No locks: when threads race, the total may drift and an entry may be dropped early, never an answer
#   changed. A caller that needs more (the service registry's bounded maps) holds its own lock around it.
# - The owner of a cache is the object whose lifetime bounds it (a grammar's masks, a vocabulary's
#   verdicts, the registry's compiled grammars): there is no module-level instance.
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["LruCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """Entries dropped least recently used first once their sizes add up past `max_size`."""

    __slots__ = ("_entries", "max_size", "size")

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
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

    def put(self, key: K, value: V, size: int = 1) -> None:
        """Keeps `value` (a key already there keeps its first value) and drops what exceeds the bound."""
        entries = self._entries
        if key in entries:
            return
        entries[key] = (value, size)
        self.size += size
        while self.size > self.max_size and entries:
            try:
                _, (_, dropped) = entries.popitem(last=False)
            except KeyError:
                break
            self.size -= dropped

    def clear(self) -> None:
        """Drops every entry."""
        self._entries.clear()
        self.size = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        return key in self._entries
