"""The RocksDB store (rocksdict), raw bytes in and out, one WriteBatch per write."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch

from broker.errors import StateError


class RocksStore:
    def __init__(self, path: str | Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        try:
            self._db = Rdict(str(path), options)
        except Exception as exc:  # rocksdict raises plain Exception on a held lock
            raise StateError(f"cannot open the state store at {path}: {exc}") from None

    def get(self, key: bytes) -> bytes | None:
        value = self._db.get(key)
        return None if value is None else bytes(value)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter()
        it.seek(prefix)
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(prefix):
                break
            yield key, bytes(it.value())
            it.next()

    def write(self, puts: Mapping[bytes, bytes], deletes: Iterable[bytes]) -> None:
        batch = WriteBatch(raw_mode=True)
        for key in deletes:
            batch.delete(key)
        for key, value in puts.items():
            batch.put(key, value)
        self._db.write(batch)

    def close(self) -> None:
        self._db.close()
