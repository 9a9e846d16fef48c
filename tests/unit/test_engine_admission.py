"""What a queue does with a message it has just enqueued (SPEC 4, 6): last-value queues, and
the size limits with their overflow policies ring, reject and flow-control."""

import pytest

from broker.engine import events as ev
from broker.engine.effects import Flow
from broker.expr import Doc
from broker.values import Bookmark
from tests.unit.harness import Harness, dead_letters, delivered, queue


def send(h: Harness, data: dict | None, size: int = 10, headers: dict | None = None) -> Bookmark:
    bm = Bookmark("T", 0, h.offset)
    h.offset += 1
    doc = Doc(data, headers or {}) if data is not None else None
    h.handle(ev.MessageArrived("Q", bm, h.now, size, doc, headers or {}))
    return bm


def queued(h: Harness) -> list[int]:
    return [m.bookmark.offset for m in h.engine.queue("Q").by_seq()]


def got(effects) -> list[int]:
    return [bm.offset for _, bm, _ in delivered(effects)]


# -- last-value queues -------------------------------------------------------------------------
def test_a_newer_message_replaces_the_available_one_with_its_key(paging):
    h = Harness(queue(lvq_key="/sym", dead_letter_topic="D"))
    send(h, {"sym": "IBM", "px": 1})
    send(h, {"sym": "MSFT", "px": 2})
    send(h, {"sym": "IBM", "px": 3})
    assert queued(h) == [1, 2]
    q = h.engine.queue("Q")
    assert q.stats.removed == {"replaced": 1} and q.stats.dead_lettered == 0
    assert dead_letters(h.effects) == []  # replaced is not a failure


def test_a_leased_one_stays_and_is_replaced_when_it_comes_back(paging):
    h = Harness(queue(lvq_key="/sym"))
    old = send(h, {"sym": "IBM", "px": 1})
    h.subscribe("w")
    new = send(h, {"sym": "IBM", "px": 2})
    assert queued(h) == [0, 1]  # the leased one is not pulled back
    h.cancel("w", old)
    assert queued(h) == [new.offset]
    assert h.engine.queue("Q").stats.removed == {"replaced": 1}


def test_null_keys_never_replace_and_keys_compare_by_value(paging):
    h = Harness(queue(lvq_key="/k"))
    for data in ({"x": 1}, {"x": 2}, None, None, {"k": 1}, {"k": 1.0}, {"k": "1"},
                 {"k": True}, {"k": {"b": 1, "a": 2}}, {"k": {"a": 2, "b": 1}}):
        send(h, data)
    # no key (missing, or a payload that does not parse) never replaces; 1 and 1.0 are one
    # key, "1" and true others; objects by value
    assert queued(h) == [0, 1, 2, 3, 5, 6, 7, 9]


def test_the_index_is_rebuilt_after_a_restart(paging):
    from broker.engine.engine import Engine
    from broker.state.layout import Checkpoint, load_engine
    from broker.state.store import MemoryStore

    h = Harness(queue(lvq_key="/sym"))
    docs: dict = {}
    h.engine.doc_loader = lambda q, bm: docs.get(bm)
    store = MemoryStore()
    for i, sym in enumerate(("IBM", "MSFT")):
        bm = Bookmark("T", 0, i)
        docs[bm] = Doc({"sym": sym}, {})
        cp = Checkpoint()
        for e in h.engine.handle(ev.MessageArrived("Q", bm, h.now, 10, docs[bm], {}), h.now):
            if hasattr(e, "transition"):
                cp.add(e.transition, e.message)
        cp.write(store, h.engine)
    engine = Engine([queue(lvq_key="/sym")], doc_loader=lambda q, bm: docs.get(bm))
    load_engine(store, engine, h.now)
    bm = Bookmark("T", 0, 2)
    docs[bm] = Doc({"sym": "IBM"}, {})
    engine.handle(ev.MessageArrived("Q", bm, h.now, 10, docs[bm], {}), h.now)
    assert [m.bookmark.offset for m in engine.queue("Q").by_seq()] == [1, 2]


def test_a_browser_of_a_last_value_queue_sees_the_latest_value_per_key(paging):
    h = Harness(queue(lvq_key="/sym"))
    send(h, {"sym": "IBM", "px": 1})
    h.subscribe("w")  # leases offset 0; it stays while offset 1 replaces it as the latest
    send(h, {"sym": "IBM", "px": 2})
    send(h, {"sym": "MSFT", "px": 3})
    out = h.handle(ev.Subscribed("b", "b-Q", "Q", 1, "r", browse=True))
    assert got(out) == [1, 2]


# -- size limits -------------------------------------------------------------------------------
def test_ring_removes_the_oldest_available_to_stay_within_max_messages(paging):
    h = Harness(queue(max_messages=3, overflow_policy="ring", dead_letter_topic="D"))
    first = send(h, {"n": 0})
    h.subscribe("w")  # leases the first: it is not available, so it stays
    for n in range(1, 6):
        send(h, {"n": n})
    assert queued(h) == [0, 4, 5]
    assert h.engine.queue("Q").depth() == 3
    assert [why for _, why in dead_letters(h.effects)] == ["overflow-ring"] * 3
    assert first.offset in queued(h)


def test_ring_takes_the_lowest_priority_first(paging):
    h = Harness(queue(max_messages=2, overflow_policy="ring", priority="/p"))
    send(h, {"p": 5})
    send(h, {"p": 1})
    send(h, {"p": 1})
    assert queued(h) == [0, 2]  # the oldest of the lowest priority left
    send(h, {"p": 9})
    assert queued(h) == [0, 3]


def test_ring_counts_bytes_too(paging):
    h = Harness(queue(max_bytes=100, overflow_policy="ring"))
    for size in (40, 40, 40):
        send(h, {}, size=size)
    assert queued(h) == [1, 2] and h.engine.queue("Q").byte_count == 80


def test_reject_removes_the_newcomer(paging):
    h = Harness(queue(max_messages=2, overflow_policy="reject", dead_letter_topic="D"))
    kept = [send(h, {"n": n}) for n in range(2)]
    turned = send(h, {"n": 2})
    assert queued(h) == [0, 1]
    assert dead_letters(h.effects) == [(turned, "overflow")]
    h.subscribe("w")
    h.ack("w", kept[0])
    send(h, {"n": 3})  # room again
    assert queued(h) == [1, 3]


def test_reject_on_bytes_keeps_what_fits(paging):
    h = Harness(queue(max_bytes=50, overflow_policy="reject"))
    send(h, {}, size=30)
    send(h, {}, size=30)  # over: rejected
    send(h, {}, size=20)  # fits exactly
    assert queued(h) == [0, 2] and h.engine.queue("Q").stats.removed == {"overflow": 1}


def flows(h: Harness) -> list[tuple[str, int]]:
    return [(e.state, e.depth) for e in h.effects if isinstance(e, Flow)]


def test_flow_control_pauses_over_the_limit_and_resumes_at_80_percent(paging):
    h = Harness(queue(max_messages=5, overflow_policy="flow-control"))
    h.advance(1)  # a start says where it stands
    assert flows(h) == [("resume", 0)]
    bms = [send(h, {"n": n}) for n in range(6)]
    assert flows(h)[1:] == [("pause", 6)]
    assert len(queued(h)) == 6  # still enqueued
    h.subscribe("w", backlog=10)
    h.ack("w", *bms[:1])
    assert flows(h)[2:] == []  # 5 of 5: not yet
    h.ack("w", *bms[1:2])
    assert flows(h)[2:] == [("resume", 4)]  # 4 <= 80% of 5


@pytest.mark.parametrize("policy", ["ring", "reject"])
def test_the_limits_hold_after_a_restart(paging, policy):
    from broker.engine.engine import Engine
    from broker.state.layout import Checkpoint, load_engine
    from broker.state.store import MemoryStore

    cfg = queue(max_bytes=100, overflow_policy=policy)
    engine, store = Engine([cfg]), MemoryStore()
    for i in range(3):
        cp = Checkpoint()
        for e in engine.handle(ev.MessageArrived("Q", Bookmark("T", 0, i), 1, 45, Doc({}, {}),
                                                 {}), 1):
            if hasattr(e, "transition"):
                cp.add(e.transition, e.message)
        cp.write(store, engine)
    again = Engine([cfg])
    load_engine(store, again, 2)
    assert again.queue("Q").byte_count == 90  # the sizes were stored with the messages
    again.handle(ev.MessageArrived("Q", Bookmark("T", 0, 3), 2, 45, Doc({}, {}), {}), 2)
    assert again.queue("Q").byte_count <= 100
