"""A gap in a partition's offsets is read again once before the consumer moves past it.

Apache Kafka hands out a partition's records in offset order, and an offset it skips holds
nothing to read (a transaction marker, an aborted or a compacted record). The embedded broker
(tansu, memory storage) may hand out a record while an earlier one, written at the same moment
by another producer, is not readable yet: a consumer then moves past the earlier record and
never reads it (an ack on the commands topic lost, a source record never queued). So on a
broker that is not Apache Kafka, a consumer that meets a gap seeks back to its start, once:
what is there by then is read, and a gap still there is a real one.
"""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

log = logging.getLogger("kq.gaps")

Partition = tuple[str, int]


class GapCheck:
    """Passes a consumer's records on, holding back a partition's from a gap on until the gap
    was read again. `enabled` False (Apache Kafka): every record passes as it is."""

    def __init__(self, consumer: Consumer, enabled: bool) -> None:
        self._consumer = consumer
        self.enabled = enabled
        self._next: dict[Partition, int] = {}  # the offset each partition's next record has
        self._retried: dict[Partition, int] = {}  # the gap read again last, by its start
        self.read_again = 0  # gaps read again (a real gap is read again once, too)

    def moved(self, topic: str, partition: int, offset: int) -> None:
        """The consumer was told to read `partition` from `offset` (assigned, or sought)."""
        self._next[(topic, partition)] = offset

    def _seek(self, key: Partition, offset: int) -> bool:
        """Read `key` again from `offset`; False when the consumer refused (read on)."""
        self._retried[key] = offset
        try:
            self._consumer.seek(TopicPartition(key[0], key[1], offset))
        except KafkaException as exc:
            log.warning("%s/%d: could not read offsets from %d again: %s", *key, offset, exc)
            return False
        self.read_again += 1
        return True

    def passed(self, records: list[Message]) -> list[Message]:
        if not self.enabled:
            return records
        kept: list[Message] = []
        held: set[Partition] = set()
        for rec in records:
            offset = rec.offset()
            if rec.error() is not None or offset is None:
                kept.append(rec)
                continue
            key = (rec.topic() or "", rec.partition() or 0)
            if key in held:
                continue  # fetched again after the gap's records
            expected = self._next.get(key)
            if (expected is not None and offset > expected
                    and self._retried.get(key) != expected and self._seek(key, expected)):
                held.add(key)
                log.debug("%s/%d: offsets %d-%d missing: read again", *key, expected, offset - 1)
                continue
            self._next[key] = offset + 1
            kept.append(rec)
        return kept
