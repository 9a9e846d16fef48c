"""Sorted queues (SPEC 4, 6): ascending by `sort_key`, numbers before strings, NULL first or
last; the order survives paging and restarts."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.engine import events as ev
from broker.engine.engine import Engine
from broker.engine.ordering import NULL_FIRST, NULL_LAST, NUMBER, STRING
from broker.engine.paging import MemoryPager
from broker.expr import Doc
from broker.state.layout import Checkpoint, decode_message, encode_message, load_engine
from broker.state.pager import RocksPager, order_key
from broker.state.store import MemoryStore
from broker.values import Bookmark
from tests.unit.harness import Harness, delivered, queue

KEYS = [5, "b", None, 1.5, "10", "a", -3, "", True, {"x": 1}, "a\x00", 2]
# numbers (and strings that read as one) ascending, then strings by code point; NULL (and
# what has no order: an object) first by default, oldest first among them
ORDERED = [None, {"x": 1}, -3, 1.5, 2, 5, "10", "", "a", "a\x00", "b", True]


def send(h: Harness, key, headers=None) -> Bookmark:
    bm = Bookmark("T", 0, h.offset)
    h.offset += 1
    h.handle(ev.MessageArrived("Q", bm, h.now, 10, Doc({"k": key} if key is not None else {},
                                                       headers or {}), headers or {}))
    return bm


def order_given(h: Harness, n: int) -> list[int]:
    out = h.subscribe("w", backlog=n)
    return [bm.offset for _, bm, _ in delivered(out)]


def test_ascending_numbers_then_strings_nulls_first(paging):
    h = Harness(queue(sort_key="/k", max_per_subscription_backlog=20))
    for k in KEYS:
        send(h, k)
    expected = [KEYS.index(k) for k in ORDERED]
    assert order_given(h, len(KEYS)) == expected


def test_missing_sort_key_last(paging):
    h = Harness(queue(sort_key="/k", missing_sort_key="last"))
    for k in (None, 3, "x", None, 1):
        send(h, k)
    assert order_given(h, 5) == [4, 1, 2, 0, 3]  # equal keys (the NULLs) oldest first


def test_a_header_sort_key_sorts_numerically(paging):
    h = Harness(queue(sort_key="header('rank')"))
    for rank in (b"10", b"9", b"100"):
        send(h, 0, {"rank": rank})
    assert order_given(h, 3) == [1, 0, 2]  # 9 < 10 < 100, not "10" < "100" < "9"


def test_a_returned_message_goes_back_to_its_place(paging):
    h = Harness(queue(sort_key="/k"))
    for k in (3, 1, 2):
        send(h, k)
    h.subscribe("w")
    h.cancel("w", Bookmark("T", 0, 1))
    assert [bm.offset for _, bm, _ in delivered(h.effects)] == [1, 1]  # back first again


@pytest.mark.parametrize("window", [1, 3, 10_000])
def test_the_order_survives_a_restart_with_either_pager(tmp_path, window):
    store, first = MemoryStore(), Engine([queue(sort_key="/k")])
    for i, k in enumerate(KEYS):
        cp = Checkpoint()
        for e in first.handle(ev.MessageArrived("Q", Bookmark("T", 0, i), 1, 10,
                                                Doc({"k": k}, {}), {}), 1):
            cp.add(e.transition, e.message)  # type: ignore[union-attr]
        cp.write(store, first)
    for pager in (MemoryPager(), RocksPager(tmp_path / f"p{window}", 32 << 20)):
        engine = Engine([queue(sort_key="/k", max_per_subscription_backlog=20)],
                        pager=pager, window=window)
        load_engine(store, engine, 2)
        out = engine.handle(ev.Subscribed("w", "w-Q", "Q", 20, "r"), 2)
        assert [KEYS[d.bookmark.offset] for d in out if hasattr(d, "bookmark")] == ORDERED


def test_a_change_of_missing_sort_key_reaches_stored_messages():
    store, first = MemoryStore(), Engine([queue(sort_key="/k")])
    for i, k in enumerate((None, 1)):
        cp = Checkpoint()
        for e in first.handle(ev.MessageArrived("Q", Bookmark("T", 0, i), 1, 10,
                                                Doc({"k": k}, {}), {}), 1):
            cp.add(e.transition, e.message)  # type: ignore[union-attr]
        cp.write(store, first)
    engine = Engine([queue(sort_key="/k", missing_sort_key="last")])
    load_engine(store, engine, 2)
    out = engine.handle(ev.Subscribed("w", "w-Q", "Q", 2, "r"), 2)
    assert [d.bookmark.offset for d in out if hasattr(d, "bookmark")] == [1, 0]


def test_the_key_is_stored_with_the_message():
    from broker.engine.message import Message
    for value in ((NUMBER, -2.5), (STRING, "sym\x00é"), (NULL_FIRST, 0.0), (NULL_LAST, 0.0)):
        msg = Message(Bookmark("T", 0, 1), 1, 1)
        msg.sort_value = value
        assert decode_message(msg.bookmark, encode_message(msg)).sort_value == value


sort_values = st.one_of(
    st.tuples(st.just(NUMBER), st.floats(allow_nan=False)),
    st.tuples(st.just(STRING), st.text()),
    st.tuples(st.sampled_from([NULL_FIRST, NULL_LAST]), st.just(0.0)))


@given(st.lists(st.tuples(sort_values, st.integers(0, 2**40)), unique_by=lambda o: o[1]))
def test_pager_keys_sort_as_orders_do(orders):
    assert sorted(orders, key=order_key) == sorted(orders)
