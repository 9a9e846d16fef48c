"""What kq reads from a consumed Kafka record, on every record's path (compiled with the
service's other hot modules, see broker/compiled.py)."""

from __future__ import annotations

from confluent_kafka import Message

from broker.values import Bookmark


def bookmark_of(rec: Message) -> Bookmark:
    """The bookmark TOPIC/PARTITION/OFFSET of a consumed record."""
    topic, partition, offset = rec.topic(), rec.partition(), rec.offset()
    assert topic is not None and partition is not None and offset is not None
    return Bookmark(topic, partition, offset)


def headers_of(rec: Message) -> list[tuple[str, bytes | None]]:
    """A record's headers as (name, bytes) pairs, whatever form the client returned."""
    raw = rec.headers()
    if not raw:
        return []
    pairs = raw.items() if isinstance(raw, dict) else raw
    return [(str(k), v.encode() if isinstance(v, str) else v) for k, v in pairs]
