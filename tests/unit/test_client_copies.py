"""The client drops a copy of a delivery it already has (sent again after a crash), and only
that: the same bookmark enqueued again, or delivered again, is a new delivery."""

import functools

from broker.client.core import ClientCore, SubscriptionState
from broker.client.message import batch_of


def delivery(seq: int, delivery_count: int = 1) -> tuple:
    # as unpack_deliveries yields it (broker.client.message.Delivery)
    return ("T/0/7", delivery_count, None, False, seq, None, b"{}", [], 0)


def test_a_copy_sent_again_is_dropped_but_a_new_delivery_is_not():
    core = ClientCore("c", "c")  # no Kafka: only the routing of deliveries
    sub = SubscriptionState("Q", "s1", "queue", {})
    core.add(sub)
    route = functools.partial(core._deliver, "s1", "Q", "json")
    route(batch_of([delivery(seq=3)]))
    route(batch_of([delivery(seq=3)]))  # the same lease, sent again after a crash
    # delivered again: new; the bookmark enqueued again (a reset): new
    route(batch_of([delivery(seq=3, delivery_count=2), delivery(seq=9)]))
    assert [(m.bookmark, m.delivery_count) for m in sub.buffer] == [
        ("T/0/7", 1), ("T/0/7", 2), ("T/0/7", 1)]


def test_an_envelope_of_one_message_as_older_services_send_is_delivered():
    from broker import wire

    core = ClientCore("c", "c")
    sub = SubscriptionState("Q", "s1", "queue", {})
    core.add(sub)
    core.receive(wire.encode("envelope", {
        "kind": "message", "request_id": "", "sub_id": "s1", "queue": "Q",
        "bookmark": "T/0/7", "delivery_count": 2, "lease_deadline_ms": 1_700_000_030_000,
        "is_barrier": False, "format": "json", "key": b"k", "value": b'{"n": 1}',
        "headers": [{"key": "h", "value": b"x"}], "timestamp_ms": 1_700_000_000_000,
        "body": None, "error": None, "seq": 5, "batch": None}))
    (m,) = sub.buffer
    assert (m.bookmark, m.delivery_count, m.key, m.data, m.headers) == (
        "T/0/7", 2, b"k", {"n": 1}, [("h", b"x")])
    assert (m.lease_deadline, m.timestamp, m.is_barrier) == (1_700_000_030.0, 1_700_000_000.0,
                                                             False)


def _route_many(core: ClientCore, seqs: range) -> None:
    """Deliver one message per seq, each its own bookmark."""
    core._deliver("s1", "Q", "json", batch_of([
        (f"T/0/{s}", 1, None, False, s, None, b"{}", [], 0) for s in seqs]))


def test_copies_are_caught_over_the_last_batches_a_crash_sends_again_whatever_the_backlog():
    # The service sends again the leases of its last three journaled batches that still
    # stand, at most a backlog each: a copy that far back is dropped, for a large backlog too,
    # while what is remembered stays bounded.
    core = ClientCore("c", "c")
    sub = SubscriptionState("Q", "s1", "queue", {})
    core.add(sub)
    core.subscribed(sub, {"backlog": 10_000})
    _route_many(core, range(1, 30_001))  # three batches of a full backlog each
    _route_many(core, range(1, 10_001))  # the first batch's leases, sent again
    assert len(sub.buffer) == 30_000
    for start in range(30_001, 130_001, 10_000):  # later deliveries
        _route_many(core, range(start, start + 10_000))
    assert len(sub.received) <= 2 * 4 * 10_000


def test_a_message_without_headers_gets_a_list_of_its_own_when_they_are_read():
    core = ClientCore("c", "c")
    sub = SubscriptionState("Q", "s1", "queue", {})
    core.add(sub)
    _route_many(core, range(1, 3))
    first, second = sub.buffer
    first.headers.append(("h", b"1"))  # (as a worker adding a header before publishing it on)
    assert (first.headers, second.headers) == ([("h", b"1")], [])


def test_a_message_shows_its_headers_by_their_public_name():
    core = ClientCore("c", "c")
    sub = SubscriptionState("Q", "s1", "queue", {})
    core.add(sub)
    _route_many(core, range(1, 2))
    (message,) = sub.buffer
    shown = repr(message)
    assert shown.startswith("Message(queue='Q', bookmark=")
    assert "headers=[]" in shown and "_headers" not in shown and "_client" not in shown


def test_a_browsers_copies_shown_again_after_a_crash_are_not_shown_twice():
    from broker.engine.dispatch import BROWSE_BATCH
    from broker.service.commit import UNSENT_BATCHES

    shown = UNSENT_BATCHES * BROWSE_BATCH  # the last batches' copies, each batch's most
    for earlier in range(0, 4_001, 200):  # whenever the oldest remembered are forgotten
        core = ClientCore("c", "c")
        sub = SubscriptionState("Q", "s1", "browse", {})
        core.add(sub)
        core.subscribed(sub, {"backlog": 1, "mode": "browse"})
        if earlier:
            _route_many(core, range(1, earlier + 1))
        _route_many(core, range(earlier + 1, earlier + shown + 1))
        _route_many(core, range(earlier + 1, earlier + shown + 1))  # the cursor rewound
        assert len(sub.buffer) == earlier + shown, earlier
