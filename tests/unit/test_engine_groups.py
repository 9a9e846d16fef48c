"""Message groups (SPEC 4, 6): one holder per group at a time, a group's messages in order,
groups never blocking each other; sticky groups stay with their holder for its life, shared
ones only while it holds unacknowledged messages of them."""

import pytest

from broker.engine import events as ev
from broker.engine.effects import Deliver, Journal
from broker.engine.engine import Engine
from broker.engine.groups import NO_GROUP, group_name
from broker.engine.message import Message
from broker.expr import Doc
from broker.service.journal import decode_columns, encode_columns, transitions_in
from broker.state.layout import Checkpoint, decode_message, encode_message, load_engine
from broker.state.store import MemoryStore
from broker.values import Bookmark
from tests.unit.harness import Harness, delivered, queue


def send(h: Harness, group: object = None, **data: object) -> Bookmark:
    bm = Bookmark("T", 0, h.offset)
    h.offset += 1
    h.handle(ev.MessageArrived("Q", bm, h.now, 10, Doc({"g": group, **data}, {}), {}))
    return bm


def got(h: Harness, client: str) -> list[int]:
    """Offsets delivered to `client` so far, in order."""
    return [bm.offset for c, bm, _ in delivered(h.effects) if c == client]


def grouped(**kw: object) -> Harness:
    return Harness(queue(group_key="/g", max_per_subscription_backlog=100, **kw))


@pytest.mark.parametrize("mode", ["sticky", "shared"])
def test_a_group_has_one_holder_and_its_messages_go_in_order(mode):
    h = grouped(group_mode=mode)
    for g in "AABAB":
        send(h, g)
    h.subscribe("w1", backlog=10)
    h.subscribe("w2", backlog=10)
    assert got(h, "w1") == [0, 1, 2, 3, 4]  # the first took both groups, in order
    h.ack("w1", *(Bookmark("T", 0, i) for i in range(5)))
    send(h, "A")
    send(h, "B")
    if mode == "sticky":
        assert got(h, "w1")[5:] == [5, 6] and got(h, "w2") == []  # for w1's life
    else:
        assert got(h, "w1")[5:] + got(h, "w2") in ([5, 6], [6, 5])  # free again: anyone


def test_a_busy_group_does_not_block_the_ones_behind_it():
    h = grouped()
    h.subscribe("w1", backlog=1)
    a1, a2, b1 = send(h, "A"), send(h, "A"), send(h, "B")
    assert got(h, "w1") == [a1.offset]
    h.subscribe("w2", backlog=1)
    assert got(h, "w2") == [b1.offset]  # A2 waits for w1, B goes past it
    h.ack("w1", a1)
    assert got(h, "w1") == [a1.offset, a2.offset]


def test_a_group_waits_for_its_holder_even_when_others_have_room():
    h = grouped()
    h.subscribe("w1", backlog=1)
    h.subscribe("w2", backlog=5)
    a1, a2 = send(h, "A"), send(h, "A")
    assert delivered(h.effects) == [("w1", a1, 1)]
    h.cancel("w1", a1)  # back in the queue: still w1's group, and still first
    assert got(h, "w1") == [a1.offset, a1.offset] and got(h, "w2") == []
    h.ack("w1", a1)
    assert got(h, "w1")[-1] == a2.offset


def test_sticky_ungrouped_messages_go_to_anyone():
    h = grouped()
    h.subscribe("w1", backlog=1)
    h.subscribe("w2", backlog=1)
    send(h)
    send(h)
    assert (got(h, "w1"), got(h, "w2")) == ([0], [1])


def test_shared_ungrouped_messages_form_the_default_group():
    h = grouped(group_mode="shared")
    h.subscribe("w1", backlog=1)
    h.subscribe("w2", backlog=1)
    first, second = send(h), send(h)
    assert (got(h, "w1"), got(h, "w2")) == ([0], [])  # one holder for kq.no-group
    assert h.engine.queue("Q").group_owner == {NO_GROUP: "w1-Q"}
    h.ack("w1", first)
    assert got(h, "w1") + got(h, "w2") == [0, second.offset]


@pytest.mark.parametrize("mode", ["sticky", "shared"])
def test_a_group_moves_when_its_holder_ends(mode):
    h = grouped(group_mode=mode)
    h.subscribe("w1", backlog=5)
    a1, a2 = send(h, "A"), send(h, "A")
    h.subscribe("w2", backlog=5)
    assert got(h, "w2") == []
    h.handle(ev.Unsubscribed("w1", "w1-Q"))
    assert got(h, "w2") == [a1.offset, a2.offset]  # both returned, in order
    assert h.engine.queue("Q").group_owner == {"A": "w2-Q"}


def test_a_silent_holders_groups_move_when_it_is_dropped():
    h = Harness(queue(group_key="/g"), heartbeat_ms=1_000)
    h.subscribe("w1", backlog=5)
    a1 = send(h, "A")
    h.subscribe("w2", backlog=5)
    h.advance(600)
    h.handle(ev.Heartbeat("w2"))
    h.advance(600)  # w1 said nothing for 1.2 s
    assert got(h, "w2") == [a1.offset]


@pytest.mark.parametrize("mode", ["sticky", "shared"])
def test_a_lapsed_lease_returns_to_the_holder_only_while_it_holds_the_group(mode):
    h = Harness(queue(group_key="/g", group_mode=mode, lease_period="1s",
                      fairness="round-robin"))
    h.subscribe("w1", backlog=1)
    a1 = send(h, "A")
    h.subscribe("w2", backlog=1)
    h.handle(ev.Heartbeat("w1"))
    h.advance(1_000)
    if mode == "sticky":
        assert (got(h, "w1"), got(h, "w2")) == ([a1.offset, a1.offset], [])
    else:  # w1 held nothing of A any more: by round robin, w2's turn
        assert (got(h, "w1"), got(h, "w2")) == ([a1.offset], [a1.offset])


def test_the_holders_filter_still_applies():
    h = grouped()
    h.handle(ev.Subscribed("w1", "w1-Q", "Q", 5, "r", filter="/n < 2"))
    h.subscribe("w2", backlog=5)
    a0, a1, a2 = (send(h, "A", n=i) for i in range(3))
    b = send(h, "B", n=5)
    assert got(h, "w1") == [a0.offset, a1.offset]
    assert got(h, "w2") == [b.offset]  # A2: w1's group that w1 does not take waits
    assert h.engine.queue("Q").group_head["A"].bookmark == a2
    h.handle(ev.Unsubscribed("w1", "w1-Q"))
    assert got(h, "w2") == [b.offset, a0.offset, a1.offset, a2.offset]


def test_priority_orders_within_a_group():
    h = Harness(queue(group_key="/g", priority="/p", max_per_subscription_backlog=10))
    for p in (1, 9, 5):
        send(h, "A", p=p)
    h.subscribe("w", backlog=10)
    assert got(h, "w") == [1, 2, 0]


def test_browsers_ignore_groups():
    h = grouped()
    h.subscribe("w1", backlog=1)
    send(h, "A")
    send(h, "A")
    h.handle(ev.Subscribed("b", "b-Q", "Q", 0, "r", browse=True))
    assert got(h, "b") == [0, 1]


def test_an_expired_head_leaves_and_the_next_of_its_group_goes():
    h = Harness(queue(group_key="/g", expiration="1s"))
    send(h, "A")
    h.advance(500)
    second = send(h, "A")
    h.advance(600)  # the first expired
    h.subscribe("w")
    assert got(h, "w") == [second.offset]


@pytest.mark.parametrize(("value", "name"), [
    (7, "7"), (7.0, "7"), ("7", "7"), (2.5, "2.5"), (True, "true"), (None, None),
    (float("nan"), None), ({"b": 1, "a": 2}, '{"a":2,"b":1}'), ("", ""),
])
def test_group_names(value, name):
    assert group_name(value) == name


def test_a_header_names_the_group():
    h = Harness(queue(group_key="header('kq-group')"))
    h.subscribe("w1", backlog=5)
    bm = Bookmark("T", 0, 0)
    h.handle(ev.MessageArrived("Q", bm, h.now, 10, Doc({}, {"kq-group": b"cart-9"}),
                               {"kq-group": b"cart-9"}))
    assert h.engine.queue("Q").group_owner == {"cart-9": "w1-Q"}


def test_the_group_is_stored_and_journaled_with_the_message():
    msg = Message(Bookmark("T", 0, 1), 1, 1)
    plain = encode_message(msg)
    msg.group = "cart\x00é"
    assert decode_message(msg.bookmark, encode_message(msg)).group == "cart\x00é"
    msg.group = None
    assert encode_message(msg) == plain  # records without a group keep their layout
    h = grouped()
    send(h, "A")
    send(h)
    cols = encode_columns(h.journal)
    assert [t.group for t in transitions_in({"columns": cols})] == ["A", None]
    cols["group"] = b""  # a part written before the column: all NULL
    assert [r["group"] for r in decode_columns(cols)] == [None, None]


class Stored:
    """An engine whose every step is written to a store, as the service does."""

    def __init__(self, **kw: object) -> None:
        self.config = queue(group_key="/g", max_per_subscription_backlog=10, **kw)
        self.store = MemoryStore()
        self.engine = Engine([self.config])
        self.offset = 0

    def run(self, event: ev.Event, now: int = 1) -> list:
        out = self.engine.handle(event, now)
        cp = Checkpoint()
        for e in out:
            if isinstance(e, Journal):
                cp.add(e.transition, e.message)
        cp.write(self.store, self.engine)
        return out

    def send(self, group: str | None) -> Bookmark:
        bm = Bookmark("T", 0, self.offset)
        self.offset += 1
        self.run(ev.MessageArrived("Q", bm, 1, 10, Doc({"g": group}, {}), {}))
        return bm

    def restarted(self) -> Engine:
        self.engine = Engine([self.config])
        load_engine(self.store, self.engine, 2)
        return self.engine


def test_a_sticky_holder_survives_a_restart_with_nothing_leased():
    s = Stored()
    s.run(ev.Subscribed("w1", "w1-Q", "Q", 5, "r"))
    s.run(ev.Subscribed("w2", "w2-Q", "Q", 5, "r"))
    a = s.send("A")
    s.run(ev.Acked("w1", "Q", (a,)))
    engine = s.restarted()
    assert engine.queue("Q").group_owner == {"A": "w1-Q"}
    s.run(ev.Heartbeat("w2"))
    s.send("A")
    assert engine.queue("Q").depth() == 1 and engine.queue("Q").available_count() == 1
    out = s.run(ev.Heartbeat("w1"))
    assert [(d.client, d.bookmark.offset) for d in out if hasattr(d, "bookmark")] == [("w1", 1)]


def test_a_freed_sticky_group_stays_free_after_a_restart():
    s = Stored()
    s.run(ev.Subscribed("w1", "w1-Q", "Q", 5, "r"))
    a = s.send("A")
    s.run(ev.Acked("w1", "Q", (a,)))
    s.run(ev.Unsubscribed("w1", "w1-Q"))
    s.run(ev.Subscribed("w1", "w1-Q", "Q", 5, "r"))  # the same id again: a new subscription
    assert s.engine.queue("Q").group_owner == {}
    assert s.restarted().queue("Q").group_owner == {}


def test_shared_holders_follow_the_leased_messages_after_a_restart():
    s = Stored(group_mode="shared")
    s.run(ev.Subscribed("w1", "w1-Q", "Q", 5, "r"))
    a, b = s.send("A"), s.send("B")
    s.run(ev.Acked("w1", "Q", (b,)))
    q = s.restarted().queue("Q")
    assert q.group_owner == {"A": "w1-Q"} and q.group_taken == {"A": 1}
    s.run(ev.Acked("w1", "Q", (a,)))
    assert q.group_owner == {}


def test_a_replayed_journal_rebuilds_the_holders():
    h = grouped()
    h.subscribe("w1", backlog=1)
    h.subscribe("w2", backlog=1)
    for g in "ABAB":
        send(h, g)
    h.ack("w1", Bookmark("T", 0, 0))
    fresh = Engine([queue(group_key="/g", max_per_subscription_backlog=100)])
    for t in h.journal:
        fresh.apply(t)
    live, replayed = h.engine.queue("Q"), fresh.queue("Q")
    assert replayed.group_owner == live.group_owner == {"A": "w1-Q", "B": "w2-Q"}
    assert [m.bookmark for m in replayed.group_free.values()] == []
    assert {o: list(hs) for o, hs in replayed.group_owned.items()} == {
        o: list(hs) for o, hs in live.group_owned.items()}


def test_inspect_shows_each_messages_group_and_who_holds_which():
    from broker.service.queries import answer
    h = grouped(group_mode="shared")
    h.subscribe("w1", backlog=1)
    send(h, "A")
    send(h, "A")
    send(h)
    data = answer(h.engine, {"what": "inspect", "queue": "Q"}, h.now, lambda name: {})
    assert [(m["group"], m["state"]) for m in data["messages"]] == [
        ("A", "leased"), ("A", "available"), (NO_GROUP, "available")]
    assert data["groups"] == [{"group": "A", "sub_id": "w1-Q", "holder": "w1", "next": "T/0/1"}]
    assert data["summary"]["groups_held"] == 1


def test_a_paged_out_message_goes_only_when_it_is_its_groups_first():
    """Window 1: dispatch looks in the pager when nothing in memory is for a subscription
    with room, and takes only a group's first message there."""
    engine = Engine([queue(group_key="/g", max_per_subscription_backlog=10)], window=1)
    out = []

    def send(n: int, group: str) -> None:
        doc = Doc({"g": group, "n": n}, {})
        out.extend(engine.handle(ev.MessageArrived("Q", Bookmark("T", 0, n), 1, 10, doc), 1))

    out += engine.handle(ev.Subscribed("w", "w-Q", "Q", 10, "r", filter="/n <> 1"), 1)
    send(0, "A")  # taken: w holds A
    for n, group in ((1, "A"), (2, "A"), (3, "B"), (4, "B")):
        send(n, group)  # A1 (which w does not take) blocks A; B is free
    assert [d.bookmark.offset for d in out if hasattr(d, "bookmark")] == [0, 3, 4]
    assert engine.queue("Q").paged == 1  # A2, behind A1


def test_a_subscription_after_a_scan_of_the_pager_gets_the_oldest_it_wants():
    """Window 2 (0 and 1 in memory, the rest paged out): a's look into the pager passes 2,
    ungrouped, to find group B's first (3). b, subscribing after, wants the ungrouped ones:
    it is given 0, then 2 from the pager, not the next message after the scan's find (4),
    as it used to be."""
    engine = Engine([queue(group_key="/g", max_per_subscription_backlog=10)], window=2)
    for n, group in enumerate([None, "A", None, "B", None]):
        doc = Doc({"g": group}, {})
        engine.handle(ev.MessageArrived("Q", Bookmark("T", 0, n), 1, 10, doc), 1)
    assert engine.queue("Q").paged == 3

    def subscribe(client: str, backlog: int, where: str) -> list[int]:
        return [d.bookmark.offset for d in engine.handle(
            ev.Subscribed(client, f"{client}-Q", "Q", backlog, "r", filter=where), 1)
            if isinstance(d, Deliver)]

    assert subscribe("a", 1, "/g = 'B'") == [3]
    assert subscribe("b", 2, "/g IS NULL") == [0, 2]
