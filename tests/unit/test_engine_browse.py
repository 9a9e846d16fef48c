"""Browsers: a copy of every message still in the queue, in arrival order, leasing nothing."""

from broker.engine import events as ev
from broker.engine.dispatch import BROWSE_BATCH
from broker.engine.effects import Deliver
from broker.engine.engine import Engine
from broker.engine.queue import Message
from broker.engine.transitions import Kind
from broker.expr import Doc
from broker.values import Bookmark
from tests.unit.harness import Harness, delivered, queue, rejected, replies


def browse(h: Harness, client: str = "b", queue: str = "Q", replay_ms: int | None = None,
           filter: str | None = None, principal: str | None = None) -> list:
    return h.handle(ev.Subscribed(client, f"{client}-browse", queue, 1, "rb", filter,
                                  principal, browse=True, replay_ms=replay_ms))


def shown(effects: list, client: str = "b") -> list[Bookmark]:
    return [e.bookmark for e in effects if isinstance(e, Deliver) and e.client == client]


def test_a_browser_sees_every_queued_message_once_and_leases_none():
    h = Harness()
    bms = h.publish(3)
    h.subscribe("w1", backlog=1)  # leases the first
    out = browse(h)
    assert shown(out) == bms  # the leased one too: it is still in the queue
    assert [e.lease_deadline_ms for e in out if isinstance(e, Deliver)] == [None] * 3
    assert replies(out)[0].body["mode"] == "browse"
    q = h.engine.queue("Q")
    assert [m.state.value for m in q.messages.values()] == ["leased", "available", "available"]
    assert h.advance(1) == []  # nothing shown twice


def test_consumers_still_get_every_message_a_browser_has_seen():
    h = Harness()
    browse(h)
    bms = h.publish(3)
    assert shown(h.effects) == bms
    out = h.subscribe("w1", backlog=5)
    assert [bm for _, bm, _ in delivered(out)] == bms
    assert [dc for _, _, dc in delivered(out)] == [1, 1, 1]  # browsing counted no delivery


def test_new_messages_reach_a_browser_as_they_arrive():
    h = Harness()
    browse(h)
    (a,) = h.publish(1)
    assert shown(h.effects) == [a]
    (b,) = h.publish(1)
    assert shown(h.effects) == [a, b]


def test_finished_messages_are_not_shown():
    h = Harness()
    a, b = h.publish(2)
    h.subscribe("w1", backlog=1)
    h.ack("w1", a)
    out = browse(h)
    assert shown(out) == [b]


def test_a_replay_period_starts_with_messages_of_that_period():
    h = Harness()
    (old,) = h.publish(1)
    h.now += 60_000
    (recent,) = h.publish(1)
    h.now += 5_000
    out = browse(h, replay_ms=30_000)
    assert shown(out) == [recent]
    assert old in h.engine.queue("Q").messages


def test_a_browser_filter_is_respected():
    h = Harness()
    e = h.engine
    e.handle(ev.MessageArrived("Q", Bookmark("T", 0, 0), h.now, doc=Doc({"sym": "IBM"}, {}, 0)),
             h.now)
    e.handle(ev.MessageArrived("Q", Bookmark("T", 0, 1), h.now, doc=Doc({"sym": "MSFT"}, {}, 0)),
             h.now)
    out = browse(h, filter="/sym = 'MSFT'")
    assert shown(out) == [Bookmark("T", 0, 1)]


def test_browsers_take_no_backlog_and_no_barrier_waits_for_them():
    h = Harness(queue(barrier_expression="/flush = true"))
    browse(h)
    e = h.engine
    out = e.handle(ev.MessageArrived("Q", Bookmark("T", 0, 0), h.now,
                                     doc=Doc({"flush": True}, {}, 0)), h.now)
    assert shown(out) == [Bookmark("T", 0, 0)]
    assert [d.is_barrier for d in out if isinstance(d, Deliver)] == [True]
    # the barrier is still queued: it waits for a consumer, not for the browser
    assert Bookmark("T", 0, 0) in e.queue("Q").messages
    out = h.subscribe("w1", backlog=0)
    assert [(d.client, d.is_barrier) for d in out if isinstance(d, Deliver)] == [("w1", True)]


def test_a_deep_queue_is_shown_in_bounded_steps():
    h = Harness()
    bms = h.publish(BROWSE_BATCH + 20)
    out = browse(h)
    assert shown(out) == bms[:BROWSE_BATCH]
    assert shown(h.advance(1)) == bms[BROWSE_BATCH:]
    assert h.advance(1) == []


def test_browse_needs_read_permission():
    h = Harness()
    h.engine.auth = {"reader": __import__("re").compile("^Q$")}
    h.publish(1)
    out = browse(h, client="intruder")
    assert rejected(out) == ["not entitled: 'intruder' may not read queue 'Q'"]
    assert shown(out, "intruder") == []
    assert shown(browse(h, client="reader"), "reader") == [Bookmark("T", 0, 0)]


def test_a_replay_period_needs_browse_mode():
    h = Harness()
    out = h.handle(ev.Subscribed("w1", "s1", "Q", 1, "r", replay_ms=1000))
    assert "replay_period needs mode='browse'" in rejected(out)[0]


def test_a_browser_is_not_a_consumer_of_the_queue():
    h = Harness(queue(leasing="permissive"))
    (a,) = h.publish(1)
    h.subscribe("w1", backlog=1)
    browse(h)
    # permissive leasing lets consumers ack each other's leases; a browser is not one
    assert rejected(h.ack("b", a)) != []
    assert a in h.engine.queue("Q").messages


def test_closing_a_browser_returns_nothing_and_ends_its_copies():
    h = Harness()
    browse(h)
    h.publish(1)
    h.handle(ev.Unsubscribed("b", "b-browse"))
    assert h.engine.queue("Q").browsers == {}
    before = len(h.effects)
    h.publish(1)
    h.advance(1)
    assert shown(h.effects[before:]) == []


def test_the_journal_rebuilds_where_a_browser_stopped():
    h = Harness()
    h.publish(3)
    browse(h)
    fresh = Engine((queue(),), 10_000)
    for t in h.journal:
        fresh.apply(t)
    b = fresh.queue("Q").browsers["b-browse"]
    assert (b.cursor, b.looked_upto) == (2, 2)  # nothing left to show
    assert [t.kind for t in h.journal].count(Kind.BROWSED) == 1


def test_a_restored_browser_goes_on_after_its_cursor():
    h = Harness()
    bms = h.publish(3)
    browse(h)
    sub = next(t for t in h.journal if t.kind is Kind.SUBSCRIBED)
    stored = type(sub)(Kind.SUBSCRIBED, "Q", h.now, sub_id=sub.sub_id, client="b",
                       browse=True, seq=1)  # it had been shown the first two
    fresh = Engine((queue(),), 10_000)
    fresh.restore("Q", [Message(bm, i, h.now) for i, bm in enumerate(bms)], [stored], h.now)
    out = fresh.handle(ev.Heartbeat("b"), h.now)
    assert shown(out) == [bms[2]]


def test_a_replay_browser_sees_every_later_arrival_whatever_its_timestamp():
    h = Harness()
    browse(h, replay_ms=1_000)
    late = Bookmark("T", 0, 99)  # read late: stamped long before the browser came
    out = h.handle(ev.MessageArrived("Q", late, h.now - 3_600_000))
    assert shown(out) == [late]


def test_a_browser_sees_what_consumers_take_at_once():
    h = Harness(queue(barrier_expression="/flush = true"), queue("M", semantics="at-most-once"))
    h.subscribe("w1", backlog=1)
    h.subscribe("w2", queue="M", backlog=1)
    browse(h)
    browse(h, client="bm", queue="M")
    e = h.engine
    barrier = Bookmark("T", 0, 50)
    out = e.handle(ev.MessageArrived("Q", barrier, h.now, doc=Doc({"flush": True}, {})), h.now)
    assert [(d.client, d.is_barrier) for d in out if isinstance(d, Deliver)] == [
        ("b", True), ("w1", True)]  # the barrier went out at once: the browser saw it first
    before = len(h.effects)
    (sent,) = h.publish(1, queue="M")
    assert [d.client for d in h.effects[before:] if isinstance(d, Deliver)] == ["bm", "w2"]
    assert sent not in [m.bookmark for m in e.queue("M").available.values()]


def test_a_nondestructive_queue_is_only_browsed_whatever_mode_is_asked():
    h = Harness(queue(nondestructive=True))
    bms = h.publish(2)
    out = h.subscribe("w1", backlog=5)  # asked to consume
    assert replies(out)[0].body["mode"] == "browse"
    assert shown(out, "w1") == bms
    assert [e.lease_deadline_ms for e in out if isinstance(e, Deliver)] == [None, None]
    assert shown(h.subscribe("w2", backlog=5), "w2") == bms  # everyone sees everything
    q = h.engine.queue("Q")
    assert [m.state.value for m in q.messages.values()] == ["available", "available"]
    assert q.stats.delivered == 0


def test_default_replay_period_is_what_a_browser_gets_without_one():
    h = Harness(queue(default_replay_period="10s"))
    old = Bookmark("T", 0, 0)
    h.handle(ev.MessageArrived("Q", old, h.now - 60_000, 10))  # published a minute ago
    h.handle(ev.MessageArrived("Q", recent := Bookmark("T", 0, 1), h.now - 1_000, 10))
    assert shown(browse(h)) == [recent]  # Qpid's default filter: the last 10 s
    assert shown(browse(h, "b2", replay_ms=120_000), "b2") == [old, recent]  # its own wins
    out = h.subscribe("w1", backlog=5)  # consumers are not browsers: all of it
    assert [bm for _, bm, _ in delivered(out)] == [old, recent]


def test_default_replay_period_zero_shows_only_new_messages():
    h = Harness(queue(nondestructive=True, default_replay_period="0s"))
    h.publish(2)
    assert shown(h.subscribe("w1", backlog=5), "w1") == []
    (new,) = h.publish(1)
    assert shown(h.effects, "w1") == [new]
