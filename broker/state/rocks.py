"""The RocksDB store (rocksdict), raw bytes in and out, one WriteBatch per write."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Final

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Cache,
    Checkpoint,
    Options,
    Rdict,
    WriteBatch,
)

from broker.errors import StateError

DEFAULT_MEMORY_BUDGET: Final = 64 * 1024 * 1024
SHED_AT_LEAST: Final = 1024 * 1024  # bytes in a memtable worth a table file of their own
SHED_EVERY_S: Final = 10.0


def bounded_options(memory_budget: int) -> Options:
    """RocksDB's own memory held to about `memory_budget` bytes: half for the block cache
    (reads), a quarter for memtables (two write buffers of an eighth each, then flushed).
    Index and filter blocks stay outside the cache, held by the open tables: about 2% of
    the data (kept in a small cache they would be read again for every lookup)."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    table = BlockBasedOptions()
    table.set_block_cache(Cache(memory_budget // 2))
    # a get of a key that is not there (a finished message) is answered by the filter
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    options.set_write_buffer_size(max(memory_budget // 8, 1024 * 1024))
    options.set_max_write_buffer_number(2)
    options.set_db_write_buffer_size(memory_budget // 4)
    return options


class MemtableShedder:
    """Writes a store's memtable out when the service falls idle, so that its memory goes
    back to the system (broker.service.memory: the idle service trims the heaps): a deep
    queue loaded and then waiting would otherwise keep a write buffer full of it (about 6 MB
    for the state and the pager together, with the default budget). At most every
    SHED_EVERY_S and only a memtable of SHED_AT_LEAST: a service that falls idle between
    every few records must not make a table file of each."""

    def __init__(self) -> None:
        self._last = 0.0

    def shed(self, db: Rdict) -> bool:
        """Whether it is done: written out, or too small to be (False: ask again later)."""
        if (db.property_int_value("rocksdb.cur-size-active-mem-table") or 0) < SHED_AT_LEAST:
            return True
        now = time.monotonic()
        if now - self._last < SHED_EVERY_S:
            return False
        self._last = now
        db.flush(False)  # in RocksDB's background thread
        return True


class RocksStore:
    def __init__(self, path: str | Path, memory_budget: int = DEFAULT_MEMORY_BUDGET,
                 read_only: bool = False, remove_on_close: bool = False) -> None:
        self._path = Path(path)
        self._remove_on_close = remove_on_close
        self._shedder = MemtableShedder()
        options = bounded_options(memory_budget)
        try:
            if read_only:
                self._db = Rdict(str(path), options, access_type=AccessType.read_only())
            else:
                self._path.mkdir(parents=True, exist_ok=True)
                self._db = Rdict(str(path), options)
        except Exception as exc:  # rocksdict raises plain Exception on a held lock
            raise StateError(f"cannot open the state store at {path}: {exc}") from None

    def frozen(self, where: Path) -> RocksStore:
        """A RocksDB checkpoint (hard links to the table files, the memtable flushed first),
        opened read-only. rocksdict's snapshots cannot be iterated consistently (its
        iterators ignore the snapshot), so a checkpoint it is."""
        shutil.rmtree(where, ignore_errors=True)  # left by a crash mid-snapshot
        Checkpoint(self._db).create_checkpoint(str(where))
        return RocksStore(where, 8 * 1024 * 1024, read_only=True, remove_on_close=True)

    def clear(self) -> None:
        # every key starts with a letter (broker.state.layout)
        self._db.delete_range(b"\x00", b"\xff")

    def get(self, key: bytes) -> bytes | None:
        value = self._db.get(key)
        return None if value is None else bytes(value)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self._db.items(from_key=prefix):  # iterated in Rust: 2x faster
            assert isinstance(key, bytes) and isinstance(value, bytes)  # raw mode
            if not key.startswith(prefix):
                return
            yield key, value

    def write(self, puts: Mapping[bytes, bytes], deletes: Iterable[bytes]) -> None:
        batch = WriteBatch(raw_mode=True)
        for key in deletes:
            batch.delete(key)
        for key, value in puts.items():
            batch.put(key, value)
        self._db.write(batch)

    def shed_memory(self) -> bool:
        return self._shedder.shed(self._db)

    def close(self) -> None:
        self._db.close()
        if self._remove_on_close:
            shutil.rmtree(self._path, ignore_errors=True)
