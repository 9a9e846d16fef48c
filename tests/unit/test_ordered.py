"""`OrderIndex` (broker.engine.ordered) answers as sortedcontainers' SortedDict, the index it
replaced, over random work shaped as a queue's: mostly adds at the back and takes from the
front, with messages returning in the middle and the orders of priorities and sorted queues."""

import math
import random

import pytest
from sortedcontainers import SortedDict

from broker.engine.ordered import OrderIndex


def random_order(rng: random.Random, seq: int, kind: str):
    if kind == "arrival":
        return (math.inf, seq)
    if kind == "priority":
        return (rng.choice([math.inf, -1.0, -5.0, 2.0]), seq)
    return ((rng.choice([0, 1]), rng.choice([1.5, -2.0, 7.0])), seq)


@pytest.mark.parametrize("kind", ["arrival", "priority", "sorted"])
@pytest.mark.parametrize("seed", range(4))
def test_the_order_index_answers_as_a_sorted_dict(seed, kind):
    rng = random.Random(seed)
    ours, theirs = OrderIndex(load=4), SortedDict()  # a small load: many sublists and splits
    taken: list = []
    for seq in range(3000):
        op = rng.random()
        if op < 0.45:
            key = random_order(rng, seq, kind)
            ours[key] = theirs[key] = seq
        elif op < 0.55 and taken:  # one comes back (a cancel): anywhere in the order
            key = taken.pop(rng.randrange(len(taken)))
            ours[key] = theirs[key] = -1
        elif op < 0.8 and theirs:
            key = theirs.peekitem(0)[0] if rng.random() < 0.7 else rng.choice(list(theirs))
            assert ours.pop(key) == theirs.pop(key)
            taken.append(key)
        elif op < 0.85:
            missing = (math.inf, -seq - 1)
            assert ours.pop(missing, "none") == "none"
            with pytest.raises(KeyError):
                ours.pop(missing)
        elif theirs:
            n = len(theirs)
            i = rng.choice([0, -1, min(1, n - 1), -min(2, n), n // 2, -n, n - 1])
            assert ours.peekitem(i) == theirs.peekitem(i)
            probe = rng.choice(list(theirs))
            after = theirs.irange(probe, inclusive=(False, True))
            assert list(ours.keys_after(probe)) == list(after)
            assert list(ours.keys_from(probe)) == list(theirs.irange(probe))
            assert ours.first_values(5) == list(theirs.values()[:5])
        assert len(ours) == len(theirs) and bool(ours) == bool(theirs)
    assert list(ours) == list(theirs)
    assert list(ours.items()) == list(theirs.items())
    assert list(ours.values_reversed()) == list(reversed(theirs.values()))
    with pytest.raises(IndexError):
        ours.peekitem(len(theirs))


def test_an_empty_index_has_nothing_to_peek_and_nothing_after():
    index = OrderIndex()
    with pytest.raises(IndexError):
        index.peekitem(0)
    assert list(index.keys_after((math.inf, 0))) == [] and not index and len(index) == 0
