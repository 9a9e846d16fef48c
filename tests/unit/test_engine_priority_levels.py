"""Qpid priority queues (`priority_levels`): the kq-priority header (or the priority
expression) collapsed onto N levels, highest level first, oldest first within a level."""

import pytest

from broker.engine import events as ev
from broker.engine.ordering import level
from broker.expr import Doc
from broker.values import Bookmark
from tests.unit.harness import Harness, delivered, queue


@pytest.mark.parametrize(("levels", "expected"), [
    (2, [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]),  # 0-4 low, 5-9 high (SPEC 4)
    (3, [0, 0, 0, 0, 1, 2, 2, 2, 2, 2]),
    (5, [0, 0, 0, 1, 2, 3, 4, 4, 4, 4]),
    (10, list(range(10))),
])
def test_the_ten_priorities_fall_on_the_levels_as_in_qpid(levels, expected):
    assert [level(p, levels) for p in range(10)] == expected


def arrive(h: Harness, headers: dict, data: object = None, parses: bool = True) -> Bookmark:
    bm = Bookmark("T", 0, h.offset)
    h.offset += 1
    doc = Doc(data, headers) if parses else None
    h.handle(ev.MessageArrived("Q", bm, h.now, 10, doc, headers))
    return bm


def order(h: Harness, n: int) -> list[Bookmark]:
    out = delivered(h.handle(ev.Subscribed("w", "w-Q", "Q", n, "r")))
    return [bm for _, bm, _ in out]


def test_the_header_orders_the_queue_by_level_then_age(paging):
    h = Harness(queue(priority_levels=2, max_per_subscription_backlog=20))
    low1 = arrive(h, {"kq-priority": b"1"})
    high1 = arrive(h, {"kq-priority": b"7"})
    low2 = arrive(h, {"kq-priority": b"4"})  # 4: still the low level
    high2 = arrive(h, {"kq-priority": b"5"})
    assert order(h, 10) == [high1, high2, low1, low2]


def test_an_absent_or_unreadable_priority_counts_as_4_as_in_jms(paging):
    h = Harness(queue(priority_levels=10, max_per_subscription_backlog=20))
    five = arrive(h, {"kq-priority": b"5"})
    absent = arrive(h, {})
    garbage = arrive(h, {"kq-priority": b"high"})
    two_digits = arrive(h, {"kq-priority": b"12"})
    empty = arrive(h, {"kq-priority": None})
    three = arrive(h, {"kq-priority": b"3"})
    unparsed = arrive(h, {"kq-priority": b"9"}, parses=False)  # headers still count
    assert order(h, 10) == [unparsed, five, absent, garbage, two_digits, empty, three]


def test_a_priority_expression_gives_the_priority_instead_of_the_header(paging):
    h = Harness(queue(priority_levels=2, priority="/p", max_per_subscription_backlog=20))
    a = arrive(h, {"kq-priority": b"9"}, {"p": 1})
    b = arrive(h, {"kq-priority": b"0"}, {"p": 8.5})
    c = arrive(h, {}, {"p": "none"})  # not a number: 4, the low level
    d = arrive(h, {}, {"p": 42})  # above 9: 9
    assert order(h, 10) == [b, d, a, c]


def test_a_returned_message_keeps_its_level(paging):
    h = Harness(queue(priority_levels=2, max_per_subscription_backlog=20))
    low = arrive(h, {"kq-priority": b"0"})
    high = arrive(h, {"kq-priority": b"9"})
    (first,) = delivered(h.handle(ev.Subscribed("w", "w-Q", "Q", 1, "r")))
    assert first[1] == high
    out = h.handle(ev.Cancelled("w", "Q", high))
    assert [bm for _, bm, _ in delivered(out)] == [high]  # again before the older low one
    assert [bm for _, bm, _ in delivered(h.handle(ev.Acked("w", "Q", (high,))))] == [low]
