"""Reading specific records back from Kafka by bookmark (recovery only: it is not fast)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable

from confluent_kafka import Consumer, TopicPartition

from broker.kafka.clients import take
from broker.values import Bookmark


def fetch_records(c: Consumer, bookmarks: Iterable[Bookmark], timeout: float = 30.0):  # noqa: ANN201
    """Return {bookmark: confluent Message} for every bookmark found within `timeout`."""
    wanted: dict[tuple[str, int], set[int]] = defaultdict(set)
    for bm in bookmarks:
        wanted[(bm.topic, bm.partition)].add(bm.offset)
    found = {}
    for (topic, partition), offsets in wanted.items():
        c.assign([TopicPartition(topic, partition, min(offsets))])
        last = max(offsets)
        deadline = time.monotonic() + timeout
        done = False
        while not done and time.monotonic() < deadline:
            for rec in take(c, 500, 0.2):
                if rec.error():
                    continue
                off = rec.offset()
                if off in offsets:
                    found[Bookmark(topic, partition, off)] = rec
                if off >= last:
                    done = True
        c.unassign()
    return found
