"""An answer is for one delivery (SPEC 7): lease renewal, and late acks, cancels and expires
that must never touch a later delivery of the same message."""

from broker.engine import events as ev
from broker.engine.engine import Engine
from broker.values import Duration
from tests.unit.harness import Harness, delivered, queue, rejected, replies
from tests.unit.test_engine_replay import snapshot

HOUR = 3_600_000  # no client is dropped for silence in these tests


def _extend(h: Harness, client: str, bm, count: int, ms: int, rid: str = "x"):  # noqa: ANN001
    return h.handle(ev.Extended(client, "Q", bm, count, ms, rid))


def test_an_ack_after_the_lapse_is_refused_and_the_next_delivery_stays_leased():
    h = Harness(queue(lease_period=Duration(30_000)), heartbeat_ms=HOUR)
    (a,) = h.publish(1)
    h.subscribe("w1")
    assert delivered(h.advance(30_000)) == [("w1", a, 2)]  # lapsed, leased again to w1
    late = h.handle(ev.Acked("w1", "Q", (a,), "", delivery_counts=(1,)))
    assert rejected(late) == [f"ack {a}: lease lost: delivery 1 of it is over (its lease "
                              "lapsed or was given up; it is now delivery 2, leased)"]
    msg = h.engine.queue("Q").messages[a]
    assert (msg.state.value, msg.delivery_count) == ("leased", 2)
    # the second delivery's own ack is applied
    assert rejected(h.handle(ev.Acked("w1", "Q", (a,), "", delivery_counts=(2,)))) == []
    assert a not in h.engine.queue("Q").messages


def test_an_ack_of_a_lapsed_lease_not_yet_delivered_again_is_refused():
    h = Harness(queue(lease_period=Duration(1000), redelivery_delay=Duration(60_000)))
    (a,) = h.publish(1)
    h.subscribe("w1")
    h.advance(1000)  # lapsed; held back for the redelivery delay
    out = h.handle(ev.Acked("w1", "Q", (a,), "r", delivery_counts=(1,)))
    assert "lease lost" in rejected(out)[0] and "available again" in rejected(out)[0]
    assert a in h.engine.queue("Q").messages


def test_a_batch_ack_by_bookmark_alone_still_acks_whichever_delivery_is_current():
    h = Harness(queue(lease_period=Duration(1000)))
    (a,) = h.publish(1)
    h.subscribe("w1")
    h.advance(1000)
    assert rejected(h.ack("w1", a)) == []
    assert a not in h.engine.queue("Q").messages


def test_late_cancel_and_expire_are_refused_too():
    h = Harness(queue(lease_period=Duration(1000)))
    (a,) = h.publish(1)
    h.subscribe("w1")
    h.advance(1000)
    assert "lease lost" in rejected(h.handle(ev.Cancelled("w1", "Q", a, "c", None, None, 1)))[0]
    assert "lease lost" in rejected(h.handle(ev.ExpireRequested("w1", "Q", a, "e", None, 1)))[0]
    assert h.engine.queue("Q").messages[a].delivery_count == 2


def test_extend_moves_the_deadline_past_the_lease_period_and_the_lease_holds():
    h = Harness(queue(lease_period=Duration(30_000)), heartbeat_ms=HOUR)
    (a,) = h.publish(1)
    h.subscribe("w1")
    h.advance(25_000)
    out = _extend(h, "w1", a, 1, 60_000)
    assert replies(out)[-1].body == {"deadline_ms": h.now + 60_000}
    assert delivered(h.advance(35_000)) == []  # the first deadline passed: still leased
    msg = h.engine.queue("Q").messages[a]
    assert (msg.state.value, msg.delivery_count) == ("leased", 1)
    assert delivered(h.advance(25_000)) == [("w1", a, 2)]  # the renewed one lapses


def test_extend_after_the_lapse_is_lease_lost():
    h = Harness(queue(lease_period=Duration(1000)))
    (a,) = h.publish(1)
    h.subscribe("w1")
    h.advance(1000)
    out = _extend(h, "w1", a, 1, 5000)
    assert "lease lost" in rejected(out)[0]
    assert h.engine.queue("Q").messages[a].delivery_count == 2


def test_extend_of_another_subscribers_lease_or_an_unleased_message_is_refused():
    h = Harness()
    a, b = h.publish(2)
    h.subscribe("w1")
    assert "leased to another subscriber" in rejected(_extend(h, "w2", a, 1, 5000))[0]
    assert "not leased to w1" in rejected(_extend(h, "w1", b, 0, 5000))[0]


def test_a_renewed_lease_replays_to_the_same_deadline():
    h = Harness(queue(lease_period=Duration(30_000)), heartbeat_ms=HOUR)
    (a,) = h.publish(1)
    h.subscribe("w1")
    h.advance(10_000)
    _extend(h, "w1", a, 1, 90_000)
    fresh = Engine((queue(lease_period=Duration(30_000)),), HOUR)
    for t in h.journal:
        fresh.apply(t)
    assert snapshot(fresh) == snapshot(h.engine)
    assert fresh.queue("Q").messages[a].deadline_ms == h.now + 90_000
