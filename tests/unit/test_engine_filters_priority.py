"""Content filters, priority and ack by filter (SPEC section 6), without Kafka."""

import pytest

from broker.engine import events as ev
from broker.engine.acks import SWEEP_PART
from broker.engine.engine import Engine
from broker.engine.states import MessageState
from broker.engine.transitions import Kind
from broker.expr import Doc
from broker.values import Bookmark, Duration
from tests.unit.harness import Harness, delivered, queue, rejected, replies


def send(h: Harness, data, queue_name: str = "Q", headers=None) -> Bookmark:
    bm = Bookmark("T", 0, h.offset)
    h.offset += 1
    h.handle(ev.MessageArrived(queue_name, bm, h.now, 10, Doc(data, headers or {}, h.now)))
    return bm


def subscribe(h: Harness, client: str, filter: str | None = None, backlog: int = 10):
    return h.handle(ev.Subscribed(client, f"{client}-Q", "Q", backlog, "r", filter))


def test_a_filtered_subscription_gets_only_matching_messages_oldest_first():
    h = Harness()
    a = send(h, {"sym": "MSFT"})
    b = send(h, {"sym": "IBM", "n": 1})
    c = send(h, {"sym": "IBM", "n": 2})
    out = subscribe(h, "w1", "/sym = 'IBM'")
    assert [bm for _, bm, _ in delivered(out)] == [b, c]
    assert h.engine.queue("Q").messages[a].state is MessageState.AVAILABLE  # waits


def test_a_message_no_filter_matches_waits_and_goes_to_a_later_match():
    h = Harness()
    subscribe(h, "w1", "/sym = 'IBM'")
    a = send(h, {"sym": "MSFT"})
    assert delivered(h.effects) == []
    out = subscribe(h, "w2", "/sym = 'MSFT'")
    assert delivered(out) == [("w2", a, 1)]


def test_filters_and_unfiltered_subscriptions_share_fairly():
    h = Harness(queue(fairness="round-robin"))
    subscribe(h, "w1", "/n > 1")
    subscribe(h, "w2")
    bms = [send(h, {"n": n}) for n in (1, 2, 3, 4)]
    got = {bm: c for c, bm, _ in delivered(h.effects)}
    assert got[bms[0]] == "w2"  # only w2 wants n = 1
    assert set(got) == set(bms)


def test_a_bad_filter_is_refused_with_its_position():
    h = Harness()
    out = subscribe(h, "w1", "/sym = ")
    assert "bad filter" in rejected(out)[0] and "column 8" in rejected(out)[0]
    assert h.engine.subs == {}


def test_an_unparseable_payload_matches_no_filter():
    h = Harness()
    subscribe(h, "w1", "/sym IS NULL")  # even IS NULL: nothing is known of it
    h.handle(ev.MessageArrived("Q", Bookmark("T", 0, 0), h.now, 10, None))
    assert delivered(h.effects) == []


def test_priority_highest_first_then_oldest_null_lowest():
    h = Harness(queue(priority="/p"))
    low = send(h, {"p": 1})
    none = send(h, {"x": 1})
    text = send(h, {"p": "high"})
    high = send(h, {"p": 9})
    high2 = send(h, {"p": 9})
    mid = send(h, {"p": 5})
    subscribe(h, "w1", backlog=10)
    order = [bm for _, bm, _ in delivered(h.effects)]
    assert order[:4] == [high, high2, mid, low]
    assert set(order[4:]) == {none, text}  # NULL and non-numeric last, oldest first
    assert order[4:] == [none, text]


def test_a_redelivered_message_keeps_its_priority():
    h = Harness(queue(priority="/p", lease_period=Duration(1000)), heartbeat_ms=10**9)
    subscribe(h, "w1", backlog=1)
    high = send(h, {"p": 9})
    send(h, {"p": 1})
    send(h, {"p": 5})
    assert delivered(h.effects) == [("w1", high, 1)]
    h.handle(ev.Cancelled("w1", "Q", high, "c"))  # back: still ahead of 5 and 1
    assert delivered(h.effects)[-1] == ("w1", high, 2)


def test_ack_where_acks_matching_active_messages_strictly():
    h = Harness()
    void1 = send(h, {"status": "void"})
    keep = send(h, {"status": "ok"})
    void2 = send(h, {"status": "void"})
    subscribe(h, "w1", backlog=1)  # w1 holds void1
    subscribe(h, "w2", backlog=1)  # w2 holds keep
    out = h.handle(ev.AckWhere("w2", "Q", "/status = 'void'", "aw"))
    # strict: w2 may ack available ones and its own leases, not w1's lease of void1
    assert replies(out)[-1].body == {"acked": 1}
    q = h.engine.queue("Q")
    assert void2 not in q.messages and void1 in q.messages and keep in q.messages


def test_ack_where_permissive_acks_others_leases_too():
    h = Harness(queue(leasing="permissive"))
    void1 = send(h, {"status": "void"})
    subscribe(h, "w1", backlog=1)
    subscribe(h, "w2", backlog=0)
    out = h.handle(ev.AckWhere("w2", "Q", "/status = 'void'", "aw"))
    assert replies(out)[-1].body == {"acked": 1}
    assert void1 not in h.engine.queue("Q").messages


@pytest.mark.parametrize("window", [300, None])  # most of the queue paged out; none of it
def test_ack_where_of_a_deep_queue_goes_a_part_at_a_time_and_answers_at_the_end(window):
    h = Harness()
    h.engine = Engine([queue()], window=window)
    n = 2 * SWEEP_PART + 500
    bms = [send(h, {"status": "void" if i % 2 == 0 else "ok"}) for i in range(n)]

    def acked() -> set[Bookmark]:
        return {t.bookmark for t in h.journal if t.kind is Kind.ACKED}

    out = h.handle(ev.AckWhere("w1", "Q", "/status = 'void'", "aw"))
    assert not replies(out) and h.engine.sweeping()  # the answer comes with the last part
    assert acked() == set(bms[0:SWEEP_PART:2])  # the first part, in arrival order
    # Between the parts the shard goes on: a subscriber is served, a message arrives
    # (after the request: not one it asked about)
    assert [bm for _, bm, _ in delivered(subscribe(h, "w2", "/status = 'ok'", 1))] == [bms[1]]
    late = send(h, {"status": "void"})
    assert not replies(h.handle(ev.Proceed()))
    out = h.handle(ev.Proceed())
    assert replies(out)[-1].body == {"acked": n // 2} and not h.engine.sweeping()
    assert acked() == set(bms[0::2])
    assert h.engine.queue("Q").find(late) is not None
    assert h.handle(ev.Proceed()) == []  # nothing under way: nothing to do


def test_ack_where_with_a_bad_expression_is_refused():
    h = Harness()
    out = h.handle(ev.AckWhere("w1", "Q", "/a =", "aw"))
    assert "column" in rejected(out)[0]


def test_messages_returned_together_go_best_first_to_whoever_wants_them():
    h = Harness()
    low, high = send(h, {"p": 1}), send(h, {"p": 5})
    subscribe(h, "holder", backlog=2)  # holds both
    subscribe(h, "any", backlog=2)  # unfiltered, room for both
    subscribe(h, "big", "/p > 2", backlog=1)
    out = h.handle(ev.Unsubscribed("holder", "holder-Q"))  # both come back at once
    # oldest first: `low` to the only one that wants it; then `high` to the emptier one
    assert [(c, bm) for c, bm, _ in delivered(out)] == [("any", low), ("big", high)]


def test_a_waiting_message_is_checked_against_a_filter_once_not_on_every_arrival():
    from broker.engine.engine import Engine

    loads: list[Bookmark] = []
    docs: dict[Bookmark, Doc] = {}

    def loader(queue: str, bm: Bookmark) -> Doc:
        loads.append(bm)
        return docs[bm]

    engine = Engine([queue()], doc_loader=loader)
    for i in range(1000):
        docs[bm := Bookmark("T", 0, i)] = Doc({"sym": "MSFT"}, {})
        engine.handle(ev.MessageArrived("Q", bm, 0, 10), 0)
    engine.handle(ev.Subscribed("w", "w-Q", "Q", 10, "r", "/sym = 'IBM'"), 0)
    assert len(loads) == 1000  # each waiting message checked once
    for i in range(1000, 1100):
        docs[bm := Bookmark("T", 0, i)] = Doc({"sym": "IBM" if i % 2 else "MSFT"}, {})
        out = engine.handle(ev.MessageArrived("Q", bm, 0, 10), 0)
        assert [d.bookmark for d in out if hasattr(d, "sub_id")] == ([bm] if i % 2 else [])
        engine.handle(ev.Acked("w", "Q", (bm,)), 0) if i % 2 else None
    assert len(loads) == 1100  # each new one checked once, the waiting ones not again


def test_a_filter_that_reads_the_clock_is_checked_again_as_time_passes():
    h = Harness()
    e = h.engine
    bm = Bookmark("T", 0, 0)
    e.handle(ev.MessageArrived("Q", bm, h.now, 10, Doc({"due_s": h.now / 1000 + 5}, {})), h.now)
    assert delivered(subscribe(h, "w1", "/due_s <= NOW()")) == []
    assert delivered(h.advance(4000)) == []
    assert [b for _, b, _ in delivered(h.advance(2000))] == [bm]


def test_a_priority_from_an_earlier_config_no_longer_orders_the_queue():
    from broker.engine.engine import Engine
    from broker.engine.queue import Message
    from broker.engine.transitions import Kind, Transition

    fresh = Engine([queue(barrier_expression="/flush = true")], 10_000)  # no priority now
    old = Message(Bookmark("T", 0, 0), 0, 0)
    old.priority = 1.0  # stored when the queue had `priority`
    fresh.restore("Q", [old], [], 0)
    fresh.apply(Transition(Kind.ENQUEUED, "Q", 0, Bookmark("T", 0, 1), seq=1, priority=9.0))
    fresh.apply(Transition(Kind.ENQUEUED, "Q", 0, Bookmark("T", 0, 2), seq=2, barrier=True))
    out = fresh.handle(ev.Subscribed("w", "w-Q", "Q", 5, "r"), 0)
    assert [d.bookmark.offset for d in out if hasattr(d, "sub_id")] == [0, 1]  # oldest first


def test_filter_indexes_are_dropped_when_no_filtered_subscription_is_left():
    h = Harness()
    subscribe(h, "any", backlog=1)
    send(h, {"sym": "MSFT"})
    send(h, {"sym": "MSFT"})  # waits: "any" is full
    subscribe(h, "f", "/sym = 'IBM'", backlog=1)
    assert h.engine.queue("Q").matching != {}
    h.handle(ev.Unsubscribed("f", "f-Q"))
    for _ in range(50):
        send(h, {"sym": "MSFT"})
    q = h.engine.queue("Q")
    assert (q.matching, q.fresh) == ({}, [])


def test_a_filter_that_reads_the_clock_finds_a_match_among_paged_out_messages(paging):
    """With a deep queue most available messages are paged out; a filter reading NOW()
    must still reach them, not only the window held in memory."""
    h = Harness()
    e = h.engine
    due = [h.now / 1000 + 3600] * 50 + [h.now / 1000 - 1]  # only the last is due
    bms = []
    for i, d in enumerate(due):
        bms.append(bm := Bookmark("T", 0, i))
        e.handle(ev.MessageArrived("Q", bm, h.now, 10, Doc({"due_s": d}, {})), h.now)
    if paging == "paged":
        assert e.queues["Q"].paged == 50
    assert [b for _, b, _ in delivered(subscribe(h, "w1", "/due_s <= NOW()", backlog=5))] \
        == [bms[-1]]
