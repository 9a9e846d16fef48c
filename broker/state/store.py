"""The store interface and its in-memory implementation (for tests)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Protocol


class Store(Protocol):
    def get(self, key: bytes) -> bytes | None: ...

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) whose key starts with `prefix`, in key order."""
        ...

    def write(self, puts: Mapping[bytes, bytes], deletes: Iterable[bytes]) -> None:
        """Apply all puts and deletes atomically: all of them land or none."""
        ...

    def frozen(self, where: Path) -> Store:
        """A read-only copy of the store as it is now (a consistent point between writes),
        made under `where` (a directory that must not exist) and gone when closed."""
        ...

    def clear(self) -> None:
        """Delete everything."""
        ...

    def shed_memory(self) -> bool:
        """Hand back memory held only to make writes cheaper (the service falls idle);
        False: not now, ask again at a later idle turn."""
        ...

    def close(self) -> None: ...


class MemoryStore:
    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key in sorted(k for k in self._data if k.startswith(prefix)):
            yield key, self._data[key]

    def write(self, puts: Mapping[bytes, bytes], deletes: Iterable[bytes]) -> None:
        for key in deletes:
            self._data.pop(key, None)
        self._data.update(puts)

    def frozen(self, where: Path) -> Store:
        copy = MemoryStore()
        copy._data = dict(self._data)
        return copy

    def clear(self) -> None:
        self._data.clear()

    def shed_memory(self) -> bool:
        return True  # it is all memory

    def close(self) -> None:
        pass
