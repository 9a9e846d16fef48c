"""At-least-once rules of SPEC section 6, one test per rule."""

from broker.engine import events as ev
from broker.engine.effects import DeadLetter, Deliver, Journal
from broker.engine.states import MessageState
from broker.engine.transitions import Kind
from broker.engine.window import TIMERS_AT_LEAST
from broker.values import Duration
from tests.unit.harness import Harness, dead_letters, delivered, queue, rejected, replies


def test_oldest_first_and_one_at_a_time_by_default():
    h = Harness()
    a, b, c = h.publish(3)
    out = h.subscribe("w1")
    assert replies(out)[0].body["backlog"] == 1
    assert delivered(out) == [("w1", a, 1)]
    assert delivered(h.ack("w1", a)) == [("w1", b, 1)]
    assert delivered(h.ack("w1", b)) == [("w1", c, 1)]


def test_backlog_is_min_of_max_backlog_and_queue_cap():
    h = Harness(queue(max_per_subscription_backlog=3))
    h.publish(10)
    assert len(delivered(h.subscribe("w1", backlog=5))) == 3
    assert len(delivered(h.subscribe("w2", backlog=2))) == 2


def test_max_backlog_zero_receives_no_ordinary_message():
    h = Harness()
    h.publish(2)
    assert delivered(h.subscribe("w1", backlog=0)) == []
    assert h.engine.queue("Q").subs["w1-Q"].cap == 0


def test_lapsed_lease_returns_the_message_with_a_higher_delivery_count():
    h = Harness(queue(lease_period=Duration(5000)))
    (a,) = h.publish(1)
    h.subscribe("w1", backlog=1)
    h.subscribe("w2", backlog=1)
    assert delivered(h.advance(4999)) == []
    out = h.advance(1)
    # the lapse frees w1, and proportional fairness hands it back to the first with room
    assert delivered(out) == [("w1", a, 2)]
    returned = [e.transition for e in out if isinstance(e, Journal)
                and e.transition.kind is Kind.RETURNED]
    assert returned[0].reason == "lapsed"


def test_cancel_returns_the_message_and_counts_the_cancel():
    h = Harness()
    (a,) = h.publish(1)
    h.subscribe("w1")
    out = h.cancel("w1", a)
    assert delivered(out) == [("w1", a, 2)]
    assert h.engine.queue("Q").messages[a].cancel_count == 1


def test_max_cancels_removes_to_dead_letter_topic():
    h = Harness(queue(max_cancels=1, dead_letter_topic="DLQ"))
    (a,) = h.publish(1)
    h.subscribe("w1")
    h.cancel("w1", a)  # cancel count 1: not above the limit
    out = h.cancel("w1", a)  # 2 > 1: removed
    assert dead_letters(out) == [(a, "max-cancels")]
    assert a not in h.engine.queue("Q").messages
    assert h.engine.queue("Q").stats.removed["max-cancels"] == 1


def test_max_deliveries_removes_on_the_lapse_of_the_last_delivery():
    h = Harness(queue(max_deliveries=2, lease_period=Duration(1000), dead_letter_topic="DLQ"))
    (a,) = h.publish(1)
    h.subscribe("w1")
    assert delivered(h.advance(1000)) == [("w1", a, 2)]
    out = h.advance(1000)
    assert delivered(out) == []
    assert dead_letters(out) == [(a, "max-deliveries")]


def test_expiration_removes_an_available_message():
    h = Harness(queue(expiration=Duration(10_000), dead_letter_topic="DLQ"))
    (a,) = h.publish(1)
    assert dead_letters(h.advance(9_999)) == []
    assert dead_letters(h.advance(1)) == [(a, "expired")]
    assert h.engine.queue("Q").depth() == 0


def test_expiration_waits_for_a_leased_message_to_come_back():
    h = Harness(queue(expiration=Duration(10_000), lease_period=Duration(20_000)),
                heartbeat_ms=60_000)
    (a,) = h.publish(1)
    h.subscribe("w1")
    h.advance(15_000)
    assert h.engine.queue("Q").messages[a].state is MessageState.LEASED
    out = h.advance(5_000)  # lease lapses after the expiry: removed, not redelivered
    assert delivered(out) == []
    assert h.engine.queue("Q").stats.removed["expired"] == 1


def test_expire_request_removes_at_once():
    h = Harness(queue(dead_letter_topic="DLQ"))
    a, b = h.publish(2)
    h.subscribe("w1")
    out = h.handle(ev.ExpireRequested("w1", "Q", a, "x"))
    assert dead_letters(out) == [(a, "expire-requested")]
    assert delivered(out) == [("w1", b, 1)]


def test_dead_letter_comes_before_the_journaled_removal():
    h = Harness(queue(dead_letter_topic="DLQ"))
    (a,) = h.publish(1)
    h.subscribe("w1")
    out = h.handle(ev.ExpireRequested("w1", "Q", a, "x"))
    kinds = [type(e).__name__ for e in out]
    assert kinds.index("DeadLetter") < kinds.index("Journal")


def test_the_lease_is_journaled_before_its_delivery():
    h = Harness()
    h.publish(1)
    out = h.subscribe("w1")
    leased = next(i for i, e in enumerate(out) if isinstance(e, Journal)
                  and e.transition.kind is Kind.LEASED)
    deliver = next(i for i, e in enumerate(out) if isinstance(e, Deliver))
    assert leased < deliver


def test_unsubscribe_returns_leases_at_once_keeping_delivery_counts():
    h = Harness()
    (a,) = h.publish(1)
    h.subscribe("w1")
    h.subscribe("w2")
    out = h.handle(ev.Unsubscribed("w1", "w1-Q", "u"))
    assert delivered(out) == [("w2", a, 2)]


def test_client_close_returns_every_lease_of_every_subscription():
    h = Harness(queue("A"), queue("B"))
    a = h.publish(1, queue="A")[0]
    b = h.publish(1, queue="B")[0]
    h.subscribe("w1", "A")
    h.subscribe("w1", "B")
    h.handle(ev.ClientClosed("w1"))
    assert h.engine.queue("A").messages[a].state is MessageState.AVAILABLE
    assert h.engine.queue("B").messages[b].state is MessageState.AVAILABLE
    assert h.engine.subs == {}


def test_silent_subscriber_loses_its_leases_after_heartbeat_timeout():
    h = Harness(heartbeat_ms=10_000)
    (a,) = h.publish(1)
    h.subscribe("w1")
    h.subscribe("w2")
    h.now += 9_000
    h.handle(ev.Heartbeat("w2"))
    assert delivered(h.advance(999)) == []
    out = h.advance(1)  # w1 silent for 10s; w2 heard from 1s ago
    assert delivered(out) == [("w2", a, 2)]
    assert "w1-Q" not in h.engine.subs


def test_a_dropped_client_is_told_which_subscriptions_it_lost():
    h = Harness(queue("Q"), queue("R"), heartbeat_ms=10_000)
    h.subscribe("w1", "Q")
    h.subscribe("w1", "R")
    h.subscribe("w2", "Q")
    h.now += 9_000
    h.handle(ev.Heartbeat("w2"))
    (notice,) = replies(h.advance(1_000))  # only w1 was silent for 10 s
    assert (notice.client, notice.request_id) == ("w1", "")
    assert notice.body == {"notice": "dropped", "sub_ids": ["w1-Q", "w1-R"],
                           "reason": "no heartbeat for 10000 ms"}
    assert "w1-Q" not in h.engine.subs and "w2-Q" in h.engine.subs


def test_a_heartbeat_from_a_client_with_no_subscription_here_is_answered():
    h = Harness()
    h.subscribe("w1", "Q")
    assert replies(h.handle(ev.Heartbeat("w1"))) == []  # it has one: nothing to say
    h.handle(ev.Unsubscribed("w1", "w1-Q", "u"))
    (notice,) = replies(h.handle(ev.Heartbeat("w1")))  # its drop notice was lost, say
    assert notice.request_id == ""
    assert notice.body == {"notice": "no-subscriptions"}


def test_two_live_processes_with_one_client_name_are_told_once():
    h = Harness()
    h.subscribe("w1", "Q")
    assert replies(h.handle(ev.Heartbeat("w1", None, "a"))) == []
    assert replies(h.handle(ev.Heartbeat("w1", None, "a"))) == []
    # a restarted process: a new instance, the old one silent from then on
    assert replies(h.handle(ev.Heartbeat("w1", None, "b"))) == []
    assert replies(h.handle(ev.Heartbeat("w1", None, "b"))) == []
    h.handle(ev.Heartbeat("w1", None, "c"))  # a second process joins b ...
    (notice,) = replies(h.handle(ev.Heartbeat("w1", None, "b")))  # ... and they alternate
    assert (notice.client, notice.request_id) == ("w1", "")
    assert notice.body == {"notice": "name-in-use"}
    for instance in "cbcb":  # told once, not at every heartbeat
        assert replies(h.handle(ev.Heartbeat("w1", None, instance))) == []
    # clients from before instances were sent say nothing either way
    h.subscribe("w2", "Q")
    assert replies(h.handle(ev.Heartbeat("w2"))) == replies(h.handle(ev.Heartbeat("w2"))) == []
    # a clean close forgets the name's processes: a later pair is told again
    h.handle(ev.ClientClosed("w1"))
    h.subscribe("w1", "Q")
    for instance in "de":
        h.handle(ev.Heartbeat("w1", None, instance))
    assert [r.body for r in replies(h.handle(ev.Heartbeat("w1", None, "d")))] == [
        {"notice": "name-in-use"}]


def test_a_dropped_subscription_made_again_with_its_id_gets_messages_again():
    h = Harness(heartbeat_ms=10_000)
    (a,) = h.publish(1)
    h.subscribe("w1")
    h.advance(10_000)  # dropped; a's lease returned
    assert delivered(h.subscribe("w1")) == [("w1", a, 2)]
    assert replies(h.handle(ev.Heartbeat("w1"))) == []


def test_heartbeats_keep_a_subscription_alive():
    h = Harness(heartbeat_ms=10_000)
    h.publish(1)
    h.subscribe("w1")
    for _ in range(5):
        h.now += 5_000
        h.handle(ev.Heartbeat("w1"))
    h.advance(0)
    assert "w1-Q" in h.engine.subs


def test_a_service_that_did_not_run_does_not_count_that_time_as_its_clients_silence():
    h = Harness(heartbeat_ms=10_000)
    h.publish(1)
    h.subscribe("w1")
    h.now += 30_000  # the service was frozen: w1's heartbeats wait unread in Kafka
    h.engine.deaf_for(30_000)
    h.advance(9_999)
    assert "w1-Q" in h.engine.subs
    h.advance(1)  # silent for 10 s of the service's listening
    assert "w1-Q" not in h.engine.subs


def test_strict_leasing_refuses_acks_of_another_subscribers_lease():
    h = Harness()
    (a,) = h.publish(1)
    h.subscribe("w1")
    h.subscribe("w2")
    out = h.ack("w2", a)
    assert "leased to another subscriber" in rejected(out)[0]
    assert a in h.engine.queue("Q").messages


def test_permissive_leasing_accepts_acks_from_any_subscriber_of_the_queue():
    h = Harness(queue(leasing="permissive"))
    (a,) = h.publish(1)
    h.subscribe("w1")
    h.subscribe("w2")
    assert rejected(h.ack("w2", a)) == []
    assert a not in h.engine.queue("Q").messages


def test_permissive_leasing_refuses_a_client_that_does_not_subscribe_naming_the_rule():
    """(The refusal said "leasing is strict" on a permissive queue.)"""
    h = Harness(queue(leasing="permissive"))
    (a,) = h.publish(1)
    h.subscribe("w1")
    (why,) = rejected(h.ack("w2", a))
    assert "w2 does not subscribe to Q (leasing is permissive: its subscribers may)" in why
    assert a in h.engine.queue("Q").messages


def test_ack_of_unknown_or_already_acked_bookmark_is_refused():
    h = Harness()
    (a,) = h.publish(1)
    h.subscribe("w1")
    assert rejected(h.ack("w1", a)) == []
    assert "already acked" in rejected(h.ack("w1", a))[0]


def test_subscribe_to_unknown_queue_or_negative_backlog_is_refused():
    h = Harness()
    assert "unknown queue 'NOPE'" in rejected(h.subscribe("w1", "NOPE"))[0]
    assert "max_backlog must be >= 0" in rejected(h.subscribe("w1", backlog=-1))[0]


def test_delivery_count_counts_every_delivery():
    h = Harness()
    (a,) = h.publish(1)
    h.subscribe("w1")
    for expected in (2, 3, 4):
        assert delivered(h.cancel("w1", a)) == [("w1", a, expected)]


def test_a_message_is_in_every_queue_it_was_routed_to_independently():
    h = Harness(queue("A"), queue("B"))
    h.publish(1, queue="A")
    h.publish(1, queue="B")
    h.subscribe("w1", "A")
    assert h.engine.queue("B").depth() == 1


def test_dead_letter_effect_names_topic_and_counts():
    h = Harness(queue(max_cancels=0, dead_letter_topic="DLQ", max_deliveries=1))
    (a,) = h.publish(1)
    h.subscribe("w1")
    out = h.cancel("w1", a)
    dl = next(e for e in out if isinstance(e, DeadLetter))
    assert (dl.topic, dl.reason, dl.delivery_count, dl.cancel_count) == \
        ("DLQ", "max-deliveries", 1, 1)


def test_a_message_too_large_to_deliver_is_removed_on_arrival():
    from broker.engine.engine import Engine

    h = Harness(queue(dead_letter_topic="DLQ"))
    h.engine = Engine((queue(dead_letter_topic="DLQ"),), 10_000, max_message_bytes=1000)
    from broker.values import Bookmark

    big = Bookmark("T", 0, 0)
    out = h.handle(ev.MessageArrived("Q", big, h.now, size=1001))
    assert dead_letters(out) == [(big, "too-large")]
    assert h.engine.queue("Q").stats.removed["too-large"] == 1
    assert delivered(h.subscribe("w1")) == []


def test_acked_leases_leave_no_pile_of_timers_and_held_ones_still_lapse():
    # A lease's timer outlives its ack until its deadline; a busy queue must not keep a lease
    # period's worth of them (and their bookmarks) in memory.
    h = Harness(queue(lease_period=Duration(60_000), max_per_subscription_backlog=100),
                heartbeat_ms=10 * 60_000)
    held = h.publish(3)
    assert len(delivered(h.subscribe("slow", backlog=3))) == 3
    h.publish(5 * TIMERS_AT_LEAST)
    out = h.subscribe("fast", backlog=100)
    timers = []
    while given := [bm for _, bm, _ in delivered(out)]:
        out = h.ack("fast", *given)
        timers.append(len(h.engine.queue("Q").lease_timers))
    assert h.engine.queue("Q").stats.acked == 5 * TIMERS_AT_LEAST
    assert max(timers) <= TIMERS_AT_LEAST + 100
    # the slow one's leases, older than every rebuild of the timers, lapse on time
    assert delivered(h.advance(59_999)) == []
    assert sorted(d[1:] for d in delivered(h.advance(1))) == [(bm, 2) for bm in held]


def test_a_renewal_after_the_timers_are_rebuilt_moves_the_lapse():
    h = Harness(queue(lease_period=Duration(30_000)), heartbeat_ms=10 * 60_000)
    (a,) = h.publish(1)
    h.subscribe("slow")
    h.handle(ev.Extended("slow", "Q", a, 1, 60_000, "x"))
    h.publish(3 * TIMERS_AT_LEAST)
    out = h.subscribe("fast", backlog=50)
    while given := [bm for _, bm, _ in delivered(out)]:
        out = h.ack("fast", *given)
    assert delivered(h.advance(30_000)) == []  # the first deadline's timer was stale
    assert delivered(h.advance(30_000)) == [("slow", a, 2)]


def test_expiry_timers_of_acked_messages_do_not_pile_up_and_the_queued_still_expire():
    h = Harness(queue(expiration=Duration(600_000), lease_period=Duration(3_600_000),
                      max_per_subscription_backlog=100), heartbeat_ms=10 * 3_600_000)
    q = h.engine.queue("Q")
    total = len(h.publish(150))
    out, acked, timers = h.subscribe("fast", backlog=100), 0, []
    while total < 5 * TIMERS_AT_LEAST:  # a steady queue: as many arrive as are acked
        total += len(h.publish(100))
        given = [bm for _, bm, _ in delivered(out)]
        out = h.ack("fast", *given)
        acked += len(given)
        timers.append(len(q.expiry_timers))
    assert max(timers) <= TIMERS_AT_LEAST + 100
    leased = len(delivered(out))
    h.advance(600_000)
    # every message still available expired on time; the leased ones stay leased
    assert q.stats.removed["expired"] == total - acked - leased > 0
    assert sum(m.state is MessageState.LEASED for m in q.messages.values()) == leased
