"""Reading a partition's records between two offsets, and finding where it really ends.

A broker's high watermark is not trusted: the embedded broker under-reports it after a
multi-record write. So an end is found by reading on from the reported one until nothing
more comes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from broker.errors import KqError
from broker.kafka.clients import take, watermarks

IDLE_S = 0.3  # a partition read this long without a record has ended (for now)
PAST_END_S = 1.0  # read past the reported ends at most this long (see real_ends)
STALL_S = 30.0  # records that should be there but do not come: an error


def real_ends(c: Consumer, partitions: list[tuple[str, int]]) -> dict[tuple[str, int],
                                                                      tuple[int, int]]:
    """Per (topic, partition): (first offset, the offset after the last record), the end
    found by reading on from the reported high watermark: each partition's record there
    must come (however slow the broker is), then what follows it until all are quiet, or
    for PAST_END_S at most (a partition written all the time is never quiet: its end is
    where the reading stopped, a moment after the call, as good an end as any)."""
    found: dict[tuple[str, int], tuple[int, int]] = {}
    start: list[TopicPartition] = []
    for topic, p in partitions:
        low, high = watermarks(c, topic, p)
        found[(topic, p)] = (int(low), int(max(low, high)))
        start.append(TopicPartition(topic, p, int(max(low, high - 1))))
    waiting = {(tp.topic, tp.partition) for tp in start if found[(tp.topic, tp.partition)][1]
               > found[(tp.topic, tp.partition)][0]}
    if not start:
        return found
    c.assign(start)
    try:
        last_seen = time.monotonic()
        reached: float | None = None  # when the last partition waited for was reached
        while True:
            now = time.monotonic()
            if not waiting:
                reached = reached or now
                if now - last_seen >= IDLE_S or now - reached >= PAST_END_S:
                    break
            for rec in take(c, 1000, 0.05):
                if rec.error() is not None:
                    continue
                key = (rec.topic(), rec.partition())
                low, end = found[key]
                found[key] = (low, max(end, rec.offset() + 1))
                waiting.discard(key)
                last_seen = time.monotonic()
            if waiting:  # the last offset may be a transaction marker, never returned
                passed = c.position([TopicPartition(t, p) for t, p in sorted(waiting)])
                waiting -= {(tp.topic, tp.partition) for tp in passed
                            if tp.offset >= found[(tp.topic, tp.partition)][1]}
            if waiting and time.monotonic() - last_seen > STALL_S:
                raise KqError(f"no records from {sorted(waiting)[:3]} for {STALL_S:.0f} s "
                              "although the broker reports some: is it up?")
    finally:
        c.unassign()
    return found


def records(c: Consumer, topic: str, partition: int, start: int, end: int | None = None,
            settle_from: int | None = None) -> Iterator[Any]:
    """The records of one partition from `start`, in order, up to `end` (excluded) or, with
    no end, until the partition stays quiet for IDLE_S once it is at or past `settle_from`
    (a known end: before it a quiet partition is only slow). The caller may stop early; the
    consumer is unassigned when the iteration ends."""
    c.assign([TopicPartition(topic, partition, start)])
    settled = start if settle_from is None else settle_from
    position, last_seen = start, time.monotonic()
    try:
        while end is None or position < end:
            batch = take(c, 1000, 0.1)
            got = False
            for rec in batch:
                err = rec.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KqError(f"reading {topic}/{partition}: {err.str()}")
                position = rec.offset() + 1
                if end is not None and rec.offset() >= end:
                    return
                got = True
                yield rec
            if got:
                last_seen = time.monotonic()
                continue
            quiet = time.monotonic() - last_seen
            if end is None and position >= settled and quiet > IDLE_S:
                return
            limit = end if end is not None else settled
            # offsets may have gaps (transaction markers, compaction): the consumer's
            # position tells when nothing is left below the end
            (tp,) = c.position([TopicPartition(topic, partition)])
            if tp.offset >= limit:
                if end is not None:
                    return
                position = max(position, tp.offset)
            elif quiet > STALL_S:
                raise KqError(f"{topic}/{partition} stopped at offset {position} before "
                              f"{limit}: is the broker up?")
    finally:
        with contextlib.suppress(RuntimeError, KafkaException):  # closed by its owner already
            c.unassign()
