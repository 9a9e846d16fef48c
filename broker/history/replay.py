"""Re-publishing records of underlying topics into another topic (`kq journal replay`).

Each record keeps its key, value and headers and gains `kq-replayed-from: TOPIC/P/OFFSET`.
Source partition P goes to destination partition P (modulo the destination's partition
count), produced in order by an idempotent producer, so each source partition's order is
kept whole in one destination partition.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

REPLAYED_FROM = "kq-replayed-from"
FLUSH_TIMEOUT_S = 60.0

Source = tuple[str, int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


@dataclass
class ReplayCounts:
    matched: int = 0
    published: int = 0
    failed: int = 0

    def add(self, other: ReplayCounts) -> None:
        self.matched += other.matched
        self.published += other.published
        self.failed += other.failed

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def replay(producer: Producer, sources: Iterable[Source], to: str, to_partitions: int,
           dry_run: bool = False) -> ReplayCounts:
    """Publish each (topic, partition, offset, key, value, headers) to `to`; count what
    Kafka acknowledged and what it refused."""
    counts = ReplayCounts()

    def report(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            counts.published += 1
        else:
            counts.failed += 1

    for topic, partition, offset, key, value, headers in sources:
        counts.matched += 1
        if dry_run:
            continue
        record: dict[str, Any] = {
            "value": value, "key": key, "partition": partition % to_partitions,
            "headers": [*headers, (REPLAYED_FROM, f"{topic}/{partition}/{offset}".encode())],
            "on_delivery": report}
        while True:
            try:
                producer.produce(to, **record)
                break
            except BufferError:  # the local queue is full: let deliveries drain
                producer.poll(0.05)
            except KafkaException:  # refused before sending, e.g. larger than allowed
                counts.failed += 1
                break
        producer.poll(0)
    left = producer.flush(FLUSH_TIMEOUT_S)
    counts.failed += left  # never acknowledged
    return counts
