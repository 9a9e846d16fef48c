"""How a shard's state is laid out on PREFIX.snapshots: pure encoding and choosing.

A snapshot is every entry of the shard's store at one consistent point (its `meta/journal`
entry says which journal offset that is), cut into chunks of about CHUNK_BYTES, then one
`complete` record naming how many chunks there are and where the first is. The topic is
compacted and each snapshot has keys of its own (SHARD/ID/NNNNNN, SHARD/ID/complete), so
writing a new snapshot never touches the previous one: a crash half way leaves chunks without
a `complete`, which a restore ignores, and the previous snapshot whole. Once a snapshot is
complete, the keys of the ones it replaces are deleted (tombstones), and compaction drops them.
"""

from __future__ import annotations

import struct
import uuid
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Final

from broker import wire

CHUNK_BYTES: Final = 512 * 1024  # well under Kafka's default 1 MB record limit
COMPLETE: Final = "complete"
_U32: Final = struct.Struct("<I")


def new_id(journal_offset: int) -> str:
    """A snapshot's id: the journal offset it reflects, and a random part (two writers of a
    shard, a zombie and its successor, never share keys)."""
    return f"{journal_offset:012d}-{uuid.uuid4().hex[:8]}"


def chunk_key(shard: int, snapshot: str, seq: int) -> bytes:
    return f"{shard}/{snapshot}/{seq:06d}".encode()


def complete_key(shard: int, snapshot: str) -> bytes:
    return f"{shard}/{snapshot}/{COMPLETE}".encode()


def keys_of(shard: int, snapshot: str, chunks: int) -> list[bytes]:
    """Every key a snapshot wrote (or may have written, for one cut short)."""
    return [chunk_key(shard, snapshot, i) for i in range(chunks)] + [complete_key(shard, snapshot)]


def chunks(entries: Iterable[tuple[bytes, bytes]], shard: int, snapshot: str,
           chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[bytes, bytes, int]]:
    """(key, encoded record, entries in it) per chunk, in order."""
    seq = 0
    keys: list[bytes] = []
    values: list[bytes] = []
    size = 0
    for key, value in entries:
        keys.append(key)
        values.append(value)
        size += len(key) + len(value) + 8
        if size >= chunk_bytes:
            yield chunk_key(shard, snapshot, seq), _chunk(shard, snapshot, seq, keys, values), \
                len(keys)
            seq, keys, values, size = seq + 1, [], [], 0
    if keys or seq == 0:  # an empty store still has its one (empty) chunk
        yield chunk_key(shard, snapshot, seq), _chunk(shard, snapshot, seq, keys, values), len(keys)


def _chunk(shard: int, snapshot: str, seq: int, keys: list[bytes], values: list[bytes]) -> bytes:
    return wire.encode("snapshot", {
        "kind": "chunk", "snapshot": snapshot, "shard": shard, "seq": seq,
        "key_lengths": array("I", map(len, keys)).tobytes(), "keys": b"".join(keys),
        "value_lengths": array("I", map(len, values)).tobytes(), "values": b"".join(values),
    })


def entries_of(record: dict[str, Any]) -> Iterator[tuple[bytes, bytes]]:
    """The entries of a decoded chunk."""
    key_lengths, value_lengths = array("I"), array("I")
    key_lengths.frombytes(record["key_lengths"])
    value_lengths.frombytes(record["value_lengths"])
    return zip(_cut(record["keys"], key_lengths), _cut(record["values"], value_lengths),
               strict=True)


def _cut(joined: bytes, lengths: array[int]) -> list[bytes]:
    """`joined` cut into pieces of these lengths (slices of bytes: a list comprehension
    runs about twice as fast as a loop here, and a restore cuts millions)."""
    ends = list(accumulate(lengths))
    return [joined[a:b] for a, b in zip([0, *ends][:-1], ends, strict=True)]


def complete(shard: int, snapshot: str, chunk_count: int, entries: int, first_offset: int,
             meta: dict[str, Any], taken_ms: int, replaces: dict[str, int]) -> bytes:
    return wire.encode("snapshot", {
        "kind": COMPLETE, "snapshot": snapshot, "shard": shard, "chunks": chunk_count,
        "key_lengths": b"", "keys": b"", "value_lengths": b"", "values": b"",
        "entries": entries, "first_offset": first_offset,
        "journal_offset": meta["offset"], "batch": meta.get("batch", -1), "taken_ms": taken_ms,
        "replaces": [{"snapshot": s, "chunks": n} for s, n in sorted(replaces.items())],
    })


@dataclass(frozen=True)
class Found:
    """A complete snapshot seen on the topic."""

    snapshot: str
    shard: int
    chunks: int
    entries: int
    first_offset: int  # its chunk 0's offset
    offset: int  # its `complete` record's offset
    journal_offset: int
    taken_ms: int
    replaces: dict[str, int] = field(default_factory=dict)
    batch: int = -1  # the last journal batch it reflects


@dataclass
class Seen:
    """What a look at the end of a shard's snapshot partition found: its complete snapshots,
    newest first, and every other snapshot that still has keys there (to delete)."""

    complete: list[Found] = field(default_factory=list)
    leftovers: dict[str, int] = field(default_factory=dict)  # snapshot -> chunks seen


def survey(shard: int, records: Iterable[tuple[int, bytes | None, bytes | None]]) -> Seen:
    """Sort the (offset, key, value) records of a shard's partition: complete snapshots
    (newest journal offset first) and leftovers (chunks of snapshots cut short, and of
    replaced ones whose deletion was cut short)."""
    completes: dict[str, Found] = {}
    chunk_max: dict[str, int] = {}
    deleted: set[bytes] = set()
    prefix = f"{shard}/"
    for offset, key, value in records:
        if key is None or not key.decode(errors="replace").startswith(prefix):
            continue
        if value is None:  # a tombstone: that key is gone
            deleted.add(key)
            continue
        _, snapshot, part = key.decode().split("/", 2)
        deleted.discard(key)
        if part == COMPLETE:
            rec = wire.decode("snapshot", value)
            completes[snapshot] = Found(
                snapshot, shard, rec["chunks"], rec["entries"], rec["first_offset"], offset,
                rec["journal_offset"], rec["taken_ms"],
                {r["snapshot"]: r["chunks"] for r in rec["replaces"]}, rec["batch"])
        else:
            chunk_max[snapshot] = max(chunk_max.get(snapshot, 0), int(part) + 1)
    live = [f for s, f in completes.items() if complete_key(shard, s) not in deleted]
    live.sort(key=lambda f: (f.journal_offset, f.offset), reverse=True)
    leftovers = {s: n for s, n in chunk_max.items()
                 if s not in completes and chunk_key(shard, s, n - 1) not in deleted}
    for f in live:
        for s, n in f.replaces.items():  # deletions a crash may have cut short
            leftovers[s] = max(leftovers.get(s, 0), n)
    for f in live[1:]:
        leftovers[f.snapshot] = max(leftovers.get(f.snapshot, 0), f.chunks)
    if live:
        leftovers.pop(live[0].snapshot, None)
    return Seen(live, leftovers)
