"""Barriers: the five AMPS rules of SPEC section 6, one test each."""

from broker.engine import events as ev
from broker.engine.effects import Deliver
from broker.expr import Doc
from broker.values import Bookmark
from tests.unit.harness import Harness, delivered, queue


def send(h: Harness, data) -> Bookmark:
    bm = Bookmark("T", 0, h.offset)
    h.offset += 1
    h.handle(ev.MessageArrived("Q", bm, h.now, 10, Doc(data, {}, h.now)))
    return bm


def sub(h: Harness, client: str, backlog: int = 10, filter: str | None = None):
    return h.handle(ev.Subscribed(client, f"{client}-Q", "Q", backlog, "r", filter))


def barrier_queue() -> Harness:
    return Harness(queue(barrier_expression="/barrier = true"))


def barriers_to(effects) -> list[tuple[str, Bookmark]]:
    return [(e.client, e.bookmark) for e in effects if isinstance(e, Deliver) and e.is_barrier]


def test_rule_1_a_barrier_waits_until_everything_before_it_is_finished():
    h = barrier_queue()
    sub(h, "w1", backlog=1)
    a = send(h, {"n": 1})
    b = send(h, {"n": 2})
    bar = send(h, {"barrier": True})
    assert barriers_to(h.effects) == []
    h.ack("w1", a)  # b is delivered next, still before the barrier
    assert barriers_to(h.effects) == []
    out = h.ack("w1", b)
    assert barriers_to(out) == [("w1", bar)]


def test_rule_2_nothing_after_a_barrier_is_delivered_before_it_is_sent():
    h = barrier_queue()
    sub(h, "w1", backlog=1)
    a = send(h, {"n": 1})
    bar = send(h, {"barrier": True})
    after = send(h, {"n": 3})
    sub(h, "w2", backlog=10)  # room, but `after` is behind the barrier
    assert [bm for _, bm, _ in delivered(h.effects) if bm == after] == []
    out = h.ack("w1", a)
    order = [e.bookmark for e in out if isinstance(e, Deliver)]
    assert order.index(bar) < order.index(after)


def test_rule_3_sent_to_every_matching_subscription_ignoring_backlogs():
    h = barrier_queue()
    sub(h, "full", backlog=1)
    sub(h, "zero", backlog=0)
    sub(h, "other", backlog=5, filter="/kind = 'x'")
    a = send(h, {"n": 1})  # fills `full`
    bar = send(h, {"barrier": True})
    later = send(h, {"kind": "x"})
    # `other` has room and wants `later`, but pauses for the barrier all the same
    assert [bm for _, bm, _ in delivered(h.effects)] == [a]
    out = h.ack("full", a)
    assert sorted(barriers_to(out)) == [("full", bar), ("zero", bar)]  # not `other`
    assert later in [bm for _, bm, _ in delivered(out)]


def test_rule_4_a_barrier_is_removed_at_once_and_needs_no_ack():
    h = barrier_queue()
    sub(h, "w1")
    bar = send(h, {"barrier": True})
    assert barriers_to(h.effects) == [("w1", bar)]
    q = h.engine.queue("Q")
    assert bar not in q.messages and q.stats.removed["barrier-sent"] == 1
    assert q.stats.dead_lettered == 0


def test_rule_5_a_barrier_does_not_count_toward_the_backlog():
    h = barrier_queue()
    sub(h, "w1", backlog=1)
    send(h, {"barrier": True})
    a = send(h, {"n": 1})
    assert ("w1", a, 1) in delivered(h.effects)
    assert len(h.engine.queue("Q").subs["w1-Q"].held) == 1


def test_a_barrier_waits_for_a_subscriber_and_unparseable_payloads_are_not_barriers():
    h = barrier_queue()
    bar = send(h, {"barrier": True})
    h.handle(ev.MessageArrived("Q", Bookmark("T", 0, 99), h.now, 10, None))
    assert bar in h.engine.queue("Q").messages
    out = sub(h, "w1")
    assert barriers_to(out) == [("w1", bar)]
    assert ("w1", Bookmark("T", 0, 99), 1) in delivered(out)


def test_a_sent_barrier_is_not_counted_as_dead_lettered():
    from broker.engine import events as ev
    from broker.engine.effects import DeadLetter
    from broker.expr import Doc
    from broker.values import Bookmark
    from tests.unit.harness import Harness, queue

    h = Harness(queue(barrier_expression="/b = true", dead_letter_topic="DLQ"))
    h.subscribe("w1")
    h.handle(ev.MessageArrived("Q", Bookmark("T", 0, 0), h.now, doc=Doc({"b": True}, {})))
    stats = h.engine.queue("Q").stats
    assert stats.removed["barrier-sent"] == 1
    assert stats.dead_lettered == 0
    assert not any(isinstance(e, DeadLetter) for e in h.effects)


def test_a_filtered_subscription_is_not_stalled_by_a_barrier_it_matches(paging):
    # (found by the property machine: the barrier stood at the head of the filter's index,
    # so the paged-out message before it that the filter takes was never looked for)
    h = barrier_queue()
    first, _, third = send(h, {"p": None}), send(h, {"p": "text"}), send(h, {"p": None})
    send(h, {"p": None, "barrier": True})
    out = sub(h, "w1", backlog=2, filter="/p IS NULL")
    assert [bm for _, bm, _ in delivered(out)] == [first, third]
