"""The client drops a copy of a delivery it already has (sent again after a crash), and only
that: the same bookmark enqueued again, or delivered again, is a new delivery."""

import functools
from collections import OrderedDict

from broker.client import QueueClient, Subscription


def delivery(seq: int, delivery_count: int = 1) -> dict:
    return {"bookmark": "T/0/7", "seq": seq, "delivery_count": delivery_count,
            "lease_deadline_ms": None, "is_barrier": False, "key": None, "value": b"{}",
            "headers": [], "timestamp_ms": 0}


def offline_client() -> tuple[QueueClient, Subscription]:
    client = QueueClient.__new__(QueueClient)  # no Kafka: only the routing of deliveries
    sub = Subscription(client, "Q", "s1", 1)
    client._subs, client._received = {"s1": sub}, OrderedDict()
    return client, sub


def test_a_copy_sent_again_is_dropped_but_a_new_delivery_is_not():
    client, sub = offline_client()
    route = functools.partial(client._route_message, "s1", "Q", "json")
    route(delivery(seq=3))
    route(delivery(seq=3))  # the same lease, sent again after a crash
    route(delivery(seq=3, delivery_count=2))  # delivered again: new
    route(delivery(seq=9))  # the bookmark enqueued again (a reset): new
    assert [(m.bookmark, m.delivery_count) for m in sub._buffer] == [
        ("T/0/7", 1), ("T/0/7", 2), ("T/0/7", 1)]
