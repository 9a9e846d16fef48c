"""Committed journal transitions, read from Kafka (never from the service's RocksDB).

The journal holds batches in parts; a batch counts only when all its parts are there, in
order (recovery's rule, `broker.service.journal.BatchAssembler`). Here that rule is applied
to an offset range, so that Spark can read ranges in parallel and get exactly what one
sequential reader gets: a range owns the batches whose first part lies in it, skips the tail
of a batch begun before it, and reads past its end only to finish a batch begun inside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from broker import wire
from broker.service.journal import BatchAssembler, Part, transitions_of

# One row per transition: what `kq journal dump --json` prints and the kq-journal source's
# columns. `offset` is the journal record's; `index` the transition's place in that record.
FIELDS = ("batch", "offset", "index", "kind", "queue", "at_ms", "bookmark", "client",
          "sub_id", "delivery_count", "cancel_count", "deadline_ms", "reason", "seq",
          "timestamp_ms")
Row = dict[str, Any]


def whole_batches(records: Iterable[tuple[int, bytes]], end: int) -> Iterator[list[Part]]:
    """The whole batches whose first part lies before `end`, from (offset, value) records
    starting anywhere; each part carries its journal offset as `offset`."""
    assembler = BatchAssembler()
    for offset, value in records:
        part = wire.decode("journal", value)
        if offset >= end and not assembler.continues(part):
            return
        part["offset"] = offset
        whole = assembler.add(part)
        if whole is not None:
            yield whole


def rows_of(batch: list[Part]) -> Iterator[Row]:
    """A whole batch's transitions as rows, in journal order."""
    for part in batch:
        for i, t in enumerate(transitions_of(part)):
            yield {"batch": part["batch"], "offset": part["offset"], "index": i,
                   "kind": t["kind"], "queue": t["queue"], "at_ms": t["at_ms"],
                   "bookmark": t["bookmark"], "client": t["client"], "sub_id": t["sub_id"],
                   "delivery_count": t["delivery_count"], "cancel_count": t["cancel_count"],
                   "deadline_ms": t["deadline_ms"], "reason": t["reason"], "seq": t["seq"],
                   "timestamp_ms": t["timestamp_ms"]}


@dataclass(frozen=True)
class RowFilter:
    """Which transitions a reader wants (every field optional)."""

    queue: str | None = None
    kinds: frozenset[str] = frozenset()
    bookmark: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None

    def __call__(self, row: Row) -> bool:
        return ((self.queue is None or row["queue"] == self.queue)
                and (not self.kinds or row["kind"] in self.kinds)
                and (self.bookmark is None or row["bookmark"] == self.bookmark)
                and (self.since_ms is None or row["at_ms"] >= self.since_ms)
                and (self.until_ms is None or row["at_ms"] < self.until_ms))


def rows_in(records: Iterable[tuple[int, bytes]], end: int,
            wanted: Callable[[Row], bool] = lambda row: True) -> Iterator[Row]:
    """The committed transitions a range owns, filtered."""
    for batch in whole_batches(records, end):
        yield from (row for row in rows_of(batch) if wanted(row))
