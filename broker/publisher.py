"""A producer that honours flow control (SPEC 5): `broker.client.Publisher`.

A queue with `overflow_policy = "flow-control"` writes a `pause` record to PREFIX.flow when it
goes over a limit and a `resume` record once it is back at 80% of every limit. The publisher
follows that topic in the background and, before producing to a topic, waits while a queue
reading that topic is paused. Which queues read which topic it learns from the service once,
at start (or from `queues=`, queue name -> regex of its topics, as in the config).

A raw Kafka producer may do the same by reading PREFIX.flow itself; nothing forces a producer
to wait: flow control asks, and the queue keeps enqueueing whatever comes.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

from confluent_kafka import TopicPartition

from broker.errors import KqError
from broker.kafka import clients

Headers = list[tuple[str, str | bytes | None]] | dict[str, str | bytes | None]


class Publisher:
    def __init__(self, bootstrap_servers: str, topic_prefix: str = "kq",
                 queues: dict[str, str] | None = None,
                 kafka_config: dict[str, Any] | None = None, max_wait: float = 60.0) -> None:
        """`max_wait`: how long `publish` waits for a paused queue before it raises KqError."""
        self.max_wait = max_wait
        extra = dict(kafka_config or {})
        if queues is None:
            queues = _queues_of_service(bootstrap_servers, topic_prefix, extra)
        self._readers = {name: re.compile(regex) for name, regex in queues.items()}
        self._producer = clients.producer(bootstrap_servers, extra)
        self._paused: dict[str, dict[str, Any]] = {}  # queue -> its last pause record
        self._changed = threading.Condition()
        self._caught_up = threading.Event()
        self._stop = threading.Event()
        self._flow_topic = f"{topic_prefix}.flow"
        self._admin = clients.admin(bootstrap_servers, extra)
        self._consumer = clients.consumer(bootstrap_servers, extra)
        self._thread = threading.Thread(target=self._follow, name="kq-flow", daemon=True)
        self._thread.start()

    def publish(self, topic: str, value: bytes | None, key: bytes | None = None,
                headers: Headers | None = None) -> None:
        """Produce one record, once no queue reading `topic` is paused."""
        deadline = time.monotonic() + self.max_wait
        if not self._caught_up.wait(self.max_wait):
            raise KqError(f"could not read {self._flow_topic} within {self.max_wait} s")
        with self._changed:
            while paused := self.paused_for(topic):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KqError(f"queue {paused[0]} reading {topic} is paused (flow control: "
                                  f"over max_messages or max_bytes) for over {self.max_wait} s")
                self._changed.wait(left)
        while True:
            try:
                self._producer.produce(topic, value, key, headers=headers)
                break
            except BufferError:  # the producer's own queue is full: wait for room in it
                if time.monotonic() >= deadline:
                    raise KqError(f"the producer's queue stayed full for over {self.max_wait} s"
                                  " (Kafka takes the records slower than they come)") from None
                self._producer.poll(0.05)
        self._producer.poll(0)

    def paused_for(self, topic: str) -> list[str]:
        """The paused queues that read `topic` (or are named like it: it is forwarded)."""
        return sorted(q for q in self._paused
                      if q == topic or (q in self._readers and self._readers[q].search(topic)))

    def flush(self, timeout: float = 10.0) -> int:
        """Wait for every record to be written; how many are still not."""
        return int(self._producer.flush(timeout))

    def close(self) -> None:
        self.flush()
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _follow(self) -> None:
        """Read PREFIX.flow from its start: the last record per queue is its state."""
        c, topic = self._consumer, self._flow_topic
        parts = clients.topic_partitions(self._admin).get(topic) or 1
        ends = {p: clients.end_offset(c, topic, p) for p in range(parts)}
        c.assign([TopicPartition(topic, p, 0) for p in range(parts)])
        if not any(ends.values()):
            self._caught_up.set()
        while not self._stop.is_set():
            for rec in clients.take(c, 500, 0.2):
                if rec.error():
                    continue
                self._apply(rec.value())
                if rec.offset() + 1 >= ends.get(rec.partition(), 0):
                    ends[rec.partition()] = 0
                if not any(ends.values()):
                    self._caught_up.set()

    def _apply(self, value: bytes | None) -> None:
        try:
            record = json.loads(value or b"")
            queue, state = record["queue"], record["state"]
        except (ValueError, KeyError, TypeError):
            return  # not a flow record kq wrote: nothing to follow
        with self._changed:
            if state == "pause":
                self._paused[queue] = record
            else:
                self._paused.pop(queue, None)
            self._changed.notify_all()


def _queues_of_service(bootstrap: str, prefix: str, extra: dict[str, Any]) -> dict[str, str]:
    """Every queue and the regex of its topics, as the service has them."""
    from broker.client import QueueClient  # (the client module re-exports Publisher)

    with QueueClient(bootstrap, topic_prefix=prefix, kafka_config=extra) as client:
        rows = client.query(what="queues")["queues"]
    return {r["queue"]: r["underlying_topic"] for r in rows}
