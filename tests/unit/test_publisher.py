"""The Publisher's waits (broker/publisher.py), without Kafka."""

import threading

import pytest

from broker.errors import KqError
from broker.publisher import Publisher


class FullFor:
    """A producer whose queue is full for the first `n` records tried."""

    def __init__(self, n: int) -> None:
        self.refusals, self.sent, self.polls = n, [], 0

    def produce(self, topic, value, key, headers=None) -> None:
        if self.refusals:
            self.refusals -= 1
            raise BufferError("Local: Queue full")
        self.sent.append((topic, value))

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0


def publisher(producer: FullFor, max_wait: float) -> Publisher:
    pub = Publisher.__new__(Publisher)  # no Kafka: nothing paused, the flow topic read
    pub.max_wait, pub._producer, pub._paused, pub._readers = max_wait, producer, {}, {}
    pub._changed, pub._caught_up = threading.Condition(), threading.Event()
    pub._caught_up.set()
    return pub


def test_a_full_producer_queue_is_waited_out_not_raised():
    """A loop publishing faster than Kafka takes the records filled librdkafka's queue
    (100,000 records by default) and publish raised BufferError "Local: Queue full"."""
    producer = FullFor(3)
    publisher(producer, max_wait=5).publish("T", b"v")
    assert producer.sent == [("T", b"v")] and producer.polls >= 3


def test_a_producer_queue_full_for_longer_than_max_wait_raises_kq_error():
    with pytest.raises(KqError, match="queue stayed full for over 0.2 s"):
        publisher(FullFor(10**9), max_wait=0.2).publish("T", b"v")
