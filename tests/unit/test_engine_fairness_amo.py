"""Fairness (fast, round-robin, proportional) and at-most-once delivery."""

from collections import Counter

from broker.engine import events as ev
from broker.engine.states import MessageState
from broker.values import Duration
from tests.unit.harness import Harness, delivered, queue


def _three_subscribers(fairness: str, backlogs=(4, 2, 2)) -> Harness:
    h = Harness(queue(fairness=fairness))
    for i, b in enumerate(backlogs, 1):
        h.subscribe(f"w{i}", backlog=b)
    return h


def test_fast_fills_the_first_subscription_with_room_first():
    h = _three_subscribers("fast")
    h.publish(5)
    got = [c for c, _, _ in delivered(h.effects)]
    assert got == ["w1", "w1", "w1", "w1", "w2"]


def test_round_robin_takes_turns_skipping_full_subscriptions():
    h = _three_subscribers("round-robin", backlogs=(1, 3, 3))
    h.publish(6)
    got = [c for c, _, _ in delivered(h.effects)]
    assert got == ["w1", "w2", "w3", "w2", "w3", "w2"]


def test_proportional_gives_to_the_lowest_leased_to_backlog_ratio():
    h = _three_subscribers("proportional", backlogs=(4, 2, 2))
    h.publish(8)
    got = [c for c, _, _ in delivered(h.effects)]
    # ratios start 0,0,0 -> w1 (first on tie); then w2 (0), w3 (0); then w1 (1/4) ...
    assert got[:4] == ["w1", "w2", "w3", "w1"]
    assert Counter(got) == {"w1": 4, "w2": 2, "w3": 2}


def test_proportional_splits_in_proportion_to_backlog_over_time():
    h = _three_subscribers("proportional", backlogs=(4, 2, 2))
    bms = h.publish(8)
    # everybody full; acking everything frees slots in the same proportion
    for c, bm, _ in delivered(h.effects):
        h.ack(c, bm)
    assert len(bms) == 8


def test_at_most_once_message_leaves_the_queue_when_sent():
    h = Harness(queue(semantics="at-most-once"))
    (a,) = h.publish(1)
    assert delivered(h.subscribe("w1")) == [("w1", a, 1)]
    q = h.engine.queue("Q")
    assert q.depth() == 0 and q.messages[a].state is MessageState.SENT


def test_at_most_once_is_never_delivered_twice_on_unsubscribe_or_lapse():
    h = Harness(queue(semantics="at-most-once", lease_period=Duration(1000)))
    a, b = h.publish(2)
    h.subscribe("w1")
    h.subscribe("w2")
    h.handle(ev.Unsubscribed("w1", "w1-Q"))
    h.advance(5000)
    h.handle(ev.Heartbeat("w2"))
    sent = [bm for _, bm, _ in delivered(h.effects)]
    assert sorted(sent) == [a, b]  # each exactly once


def test_at_most_once_acks_free_the_backlog():
    h = Harness(queue(semantics="at-most-once", lease_period=Duration(60_000)))
    a, b = h.publish(2)
    h.subscribe("w1")
    assert delivered(h.effects) == [("w1", a, 1)]
    assert delivered(h.ack("w1", a)) == [("w1", b, 1)]


def test_at_most_once_backlog_slot_frees_after_the_lease_period_without_redelivery():
    h = Harness(queue(semantics="at-most-once", lease_period=Duration(1000)), heartbeat_ms=10**9)
    a, b = h.publish(2)
    h.subscribe("w1")
    assert delivered(h.advance(1000)) == [("w1", b, 1)]
    assert a not in h.engine.queue("Q").messages
