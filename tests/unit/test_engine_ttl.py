"""Time to live (SPEC 4, 5): the kq-expiration header, else the queue's expiration, raised to
min_ttl and lowered to max_ttl; a message past it leaves with reason `expired`."""

import pytest

from broker.engine import events as ev
from broker.engine.engine import Engine
from broker.engine.queue import Message
from broker.state.layout import decode_message, encode_message
from broker.values import Bookmark
from tests.unit.harness import Harness, dead_letters, delivered, queue


def arrive(h: Harness, ttl: bytes | None = None) -> Bookmark:
    bm = Bookmark("T", 0, h.offset)
    h.offset += 1
    headers = {} if ttl is None else {"kq-expiration": ttl}
    h.handle(ev.MessageArrived("Q", bm, h.now, 10, None, headers))
    return bm


def expired_after(h: Harness, ms: int) -> list[Bookmark]:
    return [bm for bm, why in dead_letters(h.advance(ms)) if why == "expired"]


def dlq(**kw) -> Harness:
    return Harness(queue(dead_letter_topic="DLQ", **kw))


def test_the_header_gives_a_message_its_time_to_live(paging):
    h = dlq()
    short, forever = arrive(h, b"5000"), arrive(h)
    assert expired_after(h, 4_999) == []
    assert expired_after(h, 1) == [short]
    assert expired_after(h, 10**9) == []  # no header, no expiration: it stays
    q = h.engine.queue("Q")
    assert [m.bookmark for m in q.by_seq()] == [forever]  # the one without


def test_the_header_overrides_the_queue_expiration_either_way(paging):
    h = dlq(expiration="10s")
    longer, shorter, default = arrive(h, b"20000"), arrive(h, b"1000"), arrive(h)
    assert expired_after(h, 1_000) == [shorter]
    assert expired_after(h, 9_000) == [default]
    assert expired_after(h, 10_000) == [longer]


@pytest.mark.parametrize("bad", [b"soon", b"-5", b"1.5", b"", "²".encode()])
def test_a_header_that_is_not_whole_ms_is_ignored(paging, bad):
    h = dlq(expiration="10s")
    bm = arrive(h, bad)
    assert expired_after(h, 9_999) == []
    assert expired_after(h, 1) == [bm]


def test_min_ttl_raises_and_max_ttl_lowers(paging):
    h = dlq(min_ttl="5s", max_ttl="20s")
    raised, lowered, unlimited, kept = (arrive(h, b"1000"), arrive(h, b"60000"), arrive(h),
                                        arrive(h, b"8000"))
    assert expired_after(h, 4_999) == []
    assert expired_after(h, 1) == [raised]
    assert expired_after(h, 3_000) == [kept]
    assert sorted(expired_after(h, 12_000)) == sorted([lowered, unlimited])  # max_ttl: all go


def test_min_ttl_alone_leaves_unlimited_messages_unlimited(paging):
    h = dlq(min_ttl="5s")
    arrive(h)
    assert expired_after(h, 10**9) == []


def test_a_leased_message_does_not_expire_until_it_comes_back(paging):
    h = dlq(lease_period="30s")
    bm = arrive(h, b"1000")
    assert [b for _, b, _ in delivered(h.subscribe("w", backlog=1))] == [bm]
    assert expired_after(h, 5_000) == []  # leased: past its time, still held
    assert dead_letters(h.cancel("w", bm)) == [(bm, "expired")]  # back, and gone


def test_its_own_expiry_is_stored_with_the_message():
    msg = Message(Bookmark("T", 1, 2), 3, 1_000)
    msg.expires_ms = 61_000
    back = decode_message(msg.bookmark, encode_message(msg))
    assert back.expires_ms == 61_000 and back.seq == 3
    msg.expires_ms, msg.holder = None, "sub"
    back = decode_message(msg.bookmark, encode_message(msg))
    assert back.expires_ms is None and back.holder == "sub"


def test_a_message_paged_out_and_back_in_still_expires():
    """Its timer was set in the pager when it arrived behind others; refills brought it back
    into memory, and nothing is paged out any more, before it was due."""
    h = Harness(queue(dead_letter_topic="DLQ", lease_period="1h"), heartbeat_ms=10**9)
    h.engine = Engine([queue(dead_letter_topic="DLQ", lease_period="1h")], 10**9, window=1)
    a, b, c = arrive(h), arrive(h), arrive(h)  # three: the last two are paged out
    d = arrive(h, b"30000")  # behind them: paged out at once, its timer in the pager
    q = h.engine.queue("Q")
    assert q.paged == 3
    assert [bm for _, bm, _ in delivered(h.subscribe("w", backlog=3))] == [a, b, c]
    q.refill()  # as the next dispatch begins
    assert (q.paged, q.messages[d].state.value) == (0, "available")
    assert expired_after(h, 30_000) == [d]
