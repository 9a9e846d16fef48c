"""The client drops a copy of a delivery it already has (sent again after a crash), and only
that: the same bookmark enqueued again, or delivered again, is a new delivery."""

import functools

from broker.client.core import ClientCore, SubscriptionState


def delivery(seq: int, delivery_count: int = 1) -> dict:
    return {"bookmark": "T/0/7", "seq": seq, "delivery_count": delivery_count,
            "lease_deadline_ms": None, "is_barrier": False, "key": None, "value": b"{}",
            "headers": [], "timestamp_ms": 0}


def test_a_copy_sent_again_is_dropped_but_a_new_delivery_is_not():
    core = ClientCore("c", "c")  # no Kafka: only the routing of deliveries
    sub = SubscriptionState("Q", "s1", "queue", {})
    core.add(sub)
    route = functools.partial(core._deliver, "s1", "Q", "json")
    route([delivery(seq=3)])
    route([delivery(seq=3)])  # the same lease, sent again after a crash
    route([delivery(seq=3, delivery_count=2), delivery(seq=9)])  # delivered again: new; the
    # bookmark enqueued again (a reset): new
    assert [(m.bookmark, m.delivery_count) for m in sub.buffer] == [
        ("T/0/7", 1), ("T/0/7", 2), ("T/0/7", 1)]
