"""Hold until and redelivery delay (SPEC 4, 6): a message not due yet is held, in the queue
but not available, never delivered early, never blocking the ones behind it."""

import pytest

from broker.engine import events as ev
from broker.engine.holds import redelivery_delay_ms
from broker.engine.queue import Message
from broker.state.layout import decode_message, encode_message
from broker.values import Bookmark
from tests.unit.harness import Harness, delivered, queue, rejected


def arrive(h: Harness, not_before: int | bytes | None = None) -> Bookmark:
    bm = Bookmark("T", 0, h.offset)
    h.offset += 1
    headers = {} if not_before is None else {
        "kq-not-before": not_before if isinstance(not_before, bytes) else str(not_before).encode()}
    h.handle(ev.MessageArrived("Q", bm, h.now, 10, None, headers))
    return bm


def got(effects) -> list[int]:
    return [bm.offset for _, bm, _ in delivered(effects)]


def test_a_held_message_waits_for_its_time_and_blocks_nothing(paging):
    h = Harness(queue(hold_on_publish=True))
    held = arrive(h, h.now + 5_000)
    later = arrive(h)
    assert got(h.subscribe("w", backlog=10)) == [later.offset]  # the one behind it goes
    q = h.engine.queue("Q")
    assert (q.depth(), q.available_count(), len(q.held)) == (2, 0, 1)
    assert got(h.advance(4_999)) == []
    assert got(h.advance(1)) == [held.offset]


def test_without_hold_on_publish_the_header_is_ignored(paging):
    h = Harness(queue())
    arrive(h, h.now + 5_000)
    assert got(h.subscribe("w")) == [0]


@pytest.mark.parametrize("header", [b"soon", b"-5", b"", b"12.5", "\u00b2".encode()])
def test_a_header_that_is_not_epoch_ms_holds_nothing(paging, header):
    h = Harness(queue(hold_on_publish=True))
    arrive(h, header)
    assert got(h.subscribe("w")) == [0]


def test_a_time_already_past_holds_nothing(paging):
    h = Harness(queue(hold_on_publish=True))
    arrive(h, h.now - 1)
    assert got(h.subscribe("w")) == [0]


def test_held_messages_are_released_in_time_order_and_keep_their_priority(paging):
    h = Harness(queue(hold_on_publish=True, priority_levels=2))
    h.subscribe("w", backlog=0)
    for delay, prio in ((3_000, b"1"), (1_000, b"9"), (1_000, b"1")):
        bm = Bookmark("T", 0, h.offset)
        h.offset += 1
        h.handle(ev.MessageArrived("Q", bm, h.now, 10, None, {
            "kq-not-before": str(h.now + delay).encode(), "kq-priority": prio}))
    h.advance(1_000)  # two released together; the high one goes first
    h.handle(ev.Subscribed("v", "v-Q", "Q", 10, "r"))
    assert got(h.effects[-3:]) == [1, 2]
    assert got(h.advance(2_000)) == [0]


def test_a_barrier_is_never_held(paging):
    from broker.expr import Doc
    h = Harness(queue(hold_on_publish=True, barrier_expression="/b = 1"))
    h.subscribe("w", backlog=5)
    bm = Bookmark("T", 0, 0)
    headers = {"kq-not-before": str(h.now + 9_000).encode()}
    out = h.handle(ev.MessageArrived("Q", bm, h.now, 10, Doc({"b": 1}, headers), headers))
    assert got(out) == [0]


def test_a_cancel_with_a_delay_holds_the_message_that_long(paging):
    h = Harness(queue())
    first, second = arrive(h), arrive(h)
    h.subscribe("w")
    out = h.handle(ev.Cancelled("w", "Q", first, "c", delay_ms=2_000))
    assert got(out) == [second.offset]  # the delayed one does not block the next
    h.ack("w", second)
    assert got(h.advance(1_999)) == []
    assert delivered(h.advance(1)) == [("w", first, 2)]


def test_the_queue_redelivery_delay_applies_to_cancels_and_lapses_not_to_closes(paging):
    h = Harness(queue(redelivery_delay="3s", lease_period="10s"), heartbeat_ms=10**9)
    bm = arrive(h)
    h.subscribe("w")
    h.cancel("w", bm)
    assert got(h.advance(2_999)) == []
    assert got(h.advance(1)) == [0]
    assert got(h.advance(10_000)) == []  # the lease lapses: 3 s more
    assert got(h.advance(3_000)) == [0]
    h.handle(ev.ClientClosed("w"))
    assert got(h.subscribe("v")) == [0]  # a closed subscription's leases return at once


def test_exponential_backoff_doubles_per_delivery_up_to_the_cap():
    q = queue(redelivery_delay="1s", redelivery_backoff="exponential",
              max_redelivery_delay="5s")
    assert [redelivery_delay_ms(q, dc) for dc in range(1, 6)] == [1000, 2000, 4000, 5000, 5000]
    assert redelivery_delay_ms(queue(redelivery_delay="1s"), 7) == 1000
    huge = queue(redelivery_delay="1s", redelivery_backoff="exponential")
    assert redelivery_delay_ms(huge, 10**6) == 1000 << 40  # bounded, no overflow


def test_exponential_backoff_in_the_engine(paging):
    h = Harness(queue(redelivery_delay="1s", redelivery_backoff="exponential"))
    bm = arrive(h)
    h.subscribe("w")
    waits = []
    for _ in range(3):
        h.cancel("w", bm)
        waited = 0
        while not got(h.advance(250)):
            waited += 250
        waits.append(waited + 250)
    assert waits == [1_000, 2_000, 4_000]


def test_a_held_message_can_be_acked_by_filter_and_expired_by_ttl(paging):
    h = Harness(queue(hold_on_publish=True, expiration="2s", dead_letter_topic="D"))
    arrive(h, h.now + 5_000)
    h.subscribe("w")
    assert got(h.advance(5_000)) == []  # released past its expiry: it leaves, unsent
    assert h.engine.queue("Q").stats.removed["expired"] == 1


def test_a_negative_delay_is_refused_by_the_client_side_parser():
    from broker import wire
    from broker.service.commands import Invalid, decode_command
    raw = wire.encode("command", {"type": "cancel", "client": "w", "request_id": "r",
                                  "queue": "Q", "bookmarks": ["T/0/0"], "delay_ms": -5})
    (out,) = decode_command(raw)
    assert isinstance(out, Invalid) and "delay must be >= 0" in out.message


def test_cancel_of_a_held_message_is_refused(paging):
    h = Harness(queue(hold_on_publish=True))
    bm = arrive(h, h.now + 5_000)
    h.subscribe("w")
    out = h.handle(ev.Cancelled("w", "Q", bm, "c"))
    assert rejected(out)


def test_the_moment_is_stored_with_the_message():
    msg = Message(Bookmark("T", 0, 5), 5, 1_000)
    msg.not_before_ms, msg.expires_ms = 9_000, 20_000
    back = decode_message(msg.bookmark, encode_message(msg))
    assert (back.not_before_ms, back.expires_ms) == (9_000, 20_000)
    plain = decode_message(msg.bookmark, encode_message(Message(msg.bookmark, 5, 1_000)))
    assert plain.not_before_ms is None
