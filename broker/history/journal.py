"""Committed journal transitions, read from Kafka (never from the service's RocksDB).

The journal holds batches in parts; a batch counts only when all its parts are there, in
order (recovery's rule, `broker.service.journal.BatchAssembler`). Here that rule is applied
to an offset range, so that Spark can read ranges in parallel and get exactly what one
sequential reader gets: a range owns the batches whose first part lies in it, skips the tail
of a batch begun before it, and reads past its end only to finish a batch begun inside it.
"""

from __future__ import annotations

import itertools
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

# A range read from the middle of a partition: batches held until the owner in force is
# known, and records read past the range's end to learn it (see `whole_batches`).
HELD_MAX = 2_000
LOOKAHEAD = 500


def whole_batches(records: Iterable[tuple[int, bytes]], end: int) -> Iterator[list[Part]]:
    """The whole batches whose first part lies before `end`, from (offset, value) records
    starting anywhere; each part carries its journal offset as `offset`.

    Records starting in the middle of a partition come before any marker, so whose parts
    count is not known at first (`BatchAssembler`): the batches read until the first marker
    are held, and only those of the owner in force are given (a fenced owner's batch may
    come first). When the range ends before any marker, up to LOOKAHEAD records past its end
    are read for a part of an owner whose marker lies between the assumed owner's and the
    range's start (then the assumed owner's batches were fenced ones). At most HELD_MAX
    batches are held: then the owner assumed so far stands.
    """
    assembler = BatchAssembler(settled=False)
    held: list[list[Part]] = []
    start: int | None = None
    recs = iter(records)
    for offset, value in recs:
        start = offset if start is None else start
        part = wire.decode("journal", value)
        if offset >= end and not assembler.continues(part):
            if held and not assembler.settled and _fenced_owner(
                    assembler, start, itertools.chain([(offset, value)], recs), end):
                held = []
            break
        part["offset"] = offset
        if not assembler.settled and (part["marker"] is not None or len(held) >= HELD_MAX):
            yield from _of_owner(held, assembler.reign)
            held = []
            assembler.settled = True
        whole = assembler.add(part)
        if whole is None:
            continue
        if assembler.settled:
            yield whole
        else:
            held.append(whole)
    yield from _of_owner(held, assembler.reign)


def _fenced_owner(assembler: BatchAssembler, start: int,
                  after: Iterable[tuple[int, bytes]], end: int) -> bool:
    """Whether a part past the range's end shows that the owner assumed for it was fenced:
    its writer's marker lies after the assumed owner's and before the range's start."""
    assumed = assembler.reign_offset
    if assumed is None:
        return False
    for offset, value in after:
        if offset >= end + LOOKAHEAD:
            return False
        part = wire.decode("journal", value)
        if part["marker"] is not None:
            return False  # a new reign: what it writes says nothing of the one before
        at = part.get("writer_offset")
        if at is not None and assumed < at < start:
            return True
    return False


def _of_owner(batches: list[list[Part]], reign: str | None) -> Iterator[list[Part]]:
    """The batches written by `reign` (or by a kq before version 6, which cannot tell)."""
    for batch in batches:
        if batch[0].get("writer_offset") is None or batch[0].get("writer") == reign:
            yield batch


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
